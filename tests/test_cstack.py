"""CURRENT.md parsing (sidecar.workspace.cstack), bounded reading and byte-preserving atomic writes
(sidecar.workspace.cstack_files)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.workspace.cstack import CurrentState, parse_current
from sidecar.workspace.cstack_files import MAX_CURRENT_BYTES, read_current, write_goal, write_status
from tests.tools import require_executable

SEED = """\
# Current State

## Status
working

## Task
Implementing user authentication module

## Progress
- [x] Design auth flow
- [x] Create user model
- [ ] Implement JWT tokens
- [ ] Add password hashing
- [ ] Write tests

## Blockers
(none)

## Next Steps
1. Implement JWT token generation
2. Add middleware for auth checks
"""


def md(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --- parse_current: the seed and each tolerance ---------------------------------------------


def test_seed_example_parses_exactly() -> None:
    assert parse_current(SEED) == CurrentState(
        status="working",
        task="Implementing user authentication module",
        progress_total=5,
        progress_completed=2,
        blockers=(),
        next_steps=("Implement JWT token generation", "Add middleware for auth checks"),
        warnings=(),
    )


def test_current_task_is_an_alias_of_task() -> None:
    state = parse_current("## Status\nidle\n\n## Current Task\nRefactor the parser\n")
    assert state.task == "Refactor the parser"
    assert state.warnings == ()


def test_headings_are_case_insensitive() -> None:
    text = "## STATUS\ndone\n## task\nShip it\n## PROGRESS\n- [x] a\n## blockers\n- b\n"
    state = parse_current(text)
    assert (state.status, state.task, state.progress_completed, state.blockers) == (
        "done",
        "Ship it",
        1,
        ("b",),
    )


def test_extra_and_reordered_sections_are_ignored_by_the_reader() -> None:
    text = md("""
        ## Next Steps
        - deploy
        ## Notes
        - [x] not progress
        ## Blockers
        Waiting for the API key
        ## Progress
        - [ ] one
        ## Task
        Out of order
        ## Status
        blocked
    """)
    state = parse_current(text)
    assert state.status == "blocked"
    assert state.task == "Out of order"
    assert (state.progress_total, state.progress_completed) == (1, 0)
    assert state.blockers == ("Waiting for the API key",)
    assert state.next_steps == ("deploy",)
    assert state.warnings == ()


def test_duplicated_section_first_wins_with_a_warning() -> None:
    state = parse_current("## Status\nidle\n## Task\nfirst\n## Task\nsecond\n## Status\ndone\n")
    assert (state.status, state.task) == ("idle", "first")
    assert len(state.warnings) == 2
    assert all("duplicate" in w for w in state.warnings)


def test_crlf_and_bom_read_like_lf() -> None:
    crlf = "\ufeff" + SEED.replace("\n", "\r\n")
    assert parse_current(crlf) == parse_current(SEED)


@pytest.mark.parametrize(
    "written",
    ["working", "Working", "**working**", "WORKING", "`working`", "- working", "working."],
)
def test_status_markup_and_case_are_tolerated(written: str) -> None:
    state = parse_current(f"## Status\n{written}\n")
    assert state.status == "working"
    assert state.warnings == ()


def test_status_with_a_note_after_it() -> None:
    assert parse_current("## Status\nblocked (waiting on review)\n").status == "blocked"


def test_unknown_status_value_is_named_in_a_warning() -> None:
    state = parse_current("## Status\nsnoozing\n")
    assert state.status == "unknown"
    assert any("snoozing" in w for w in state.warnings)


def test_missing_status_section_is_unknown_with_a_warning() -> None:
    state = parse_current("## Task\nx\n")
    assert state.status == "unknown"
    assert any("Status" in w for w in state.warnings)


def test_empty_text_is_unknown() -> None:
    state = parse_current("")
    assert state.status == "unknown"
    assert state.task is None
    assert state.warnings


def test_progress_accepts_star_bullets_and_capital_x() -> None:
    text = "## Progress\n- [X] a\n* [ ] b\n* [x] c\n+ [ ] d\n1. [x] e\n  - [ ] nested\n- plain\n"
    state = parse_current(text)
    assert (state.progress_total, state.progress_completed) == (6, 3)


@pytest.mark.parametrize("none", ["(none)", "none", "None.", "- (none)", "", "N/A"])
def test_no_blockers_markers(none: str) -> None:
    assert parse_current(f"## Status\nidle\n## Blockers\n{none}\n").blockers == ()


def test_blockers_as_list_items_or_plain_lines() -> None:
    text = "## Blockers\n- Need credentials\n  for the staging DB\n* CI is red\nPlain line\n"
    assert parse_current(text).blockers == (
        "Need credentials for the staging DB",
        "CI is red",
        "Plain line",
    )


def test_html_comments_are_not_content() -> None:
    """Templates explain sections in comments; the values are what is outside them."""
    text = md("""
        ## Status
        <!-- one of: idle | working
             | blocked | done -->
        **blocked**
        ## Progress
        <!--
        - [ ] example item
        -->
        - [x] real item <!-- inline note -->
        ## Blockers
        <!-- list them here -->
        - DB credentials <!-- ask ops -->
    """)
    state = parse_current(text)
    assert state.status == "blocked"
    assert (state.progress_total, state.progress_completed) == (1, 1)
    assert state.blockers == ("DB credentials",)
    assert state.warnings == ()


def test_checkboxes_in_blockers_and_next_steps() -> None:
    text = "## Blockers\n- [x] resolved\n- [ ] open one\n## Next Steps\n- [ ] a\n- [x] b\n"
    state = parse_current(text)
    assert state.blockers == ("open one",)
    assert state.next_steps == ("a", "b")


def test_multi_line_task_and_deeper_headings_stay_in_the_task() -> None:
    text = "## Task\nBuild the thing\n\n### Details\nwith care\n\n## Progress\n"
    assert parse_current(text).task == "Build the thing\n\n### Details\nwith care"


def test_escaped_heading_in_task_reads_back_without_the_backslash() -> None:
    assert parse_current("## Task\nfoo\n\\## Bar\n\\\\## Baz\n").task == "foo\n## Bar\n\\## Baz"


# --- read_current ---------------------------------------------------------------------------


def test_read_missing_file(tmp_path: Path) -> None:
    state = read_current(tmp_path / ".cstack" / "CURRENT.md")
    assert state.status == "unknown"
    assert any("not found" in w for w in state.warnings)


def test_read_seed_file(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text(SEED)
    assert read_current(path) == parse_current(SEED)


def test_read_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_bytes(b"")
    state = read_current(path)
    assert state.status == "unknown"
    assert any("empty" in w for w in state.warnings)


def test_read_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_bytes(b"## Status\nworking\n\x00\x01\x02\xff" * 10)
    state = read_current(path)
    assert state.status == "unknown"
    assert any("binary" in w for w in state.warnings)


def test_read_utf16_file(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_bytes(SEED.encode("utf-16"))
    state = read_current(path)
    assert state.status == "working"
    assert any("UTF-16" in w for w in state.warnings)


def test_read_invalid_utf8_is_decoded_with_replacement(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_bytes(b"## Status\ndone\n## Task\ncaf\xe9 \xff\n")
    state = read_current(path)
    assert state.status == "done"
    assert state.task == "caf\ufffd \ufffd"
    assert any("UTF-8" in w for w in state.warnings)


def test_read_50_mb_file_reads_only_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    with path.open("wb") as f:
        f.write(b"## Status\nworking\n## Progress\n")
        line = b"- [x] a done item\n"
        f.write(line * (50 * 1024 * 1024 // len(line)))
    assert path.stat().st_size > 50 * MAX_CURRENT_BYTES // 2
    started = time.monotonic()
    state = read_current(path)
    elapsed = time.monotonic() - started
    assert state.status == "working"
    # Only the first MAX_CURRENT_BYTES were parsed: the item count proves the bound.
    assert 0 < state.progress_total <= MAX_CURRENT_BYTES // len(line)
    assert any("larger than" in w for w in state.warnings)
    assert elapsed < 5, "reading must not scale with the file size"


ADVERSARIAL = {
    "heading with a long run of spaces": "## a" + " " * MAX_CURRENT_BYTES + "b\n",
    "many comments on one line": "## Status\n" + "<!-- a -->" * (MAX_CURRENT_BYTES // 10),
    "one very long continued item": "## Blockers\n- a\n" + " b\n" * (MAX_CURRENT_BYTES // 3),
    "thousands of duplicate sections": "## Task\n" * (MAX_CURRENT_BYTES // 8),
    "list markers without end": "## Blockers\n" + "- " * (MAX_CURRENT_BYTES // 2) + "x",
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_input_at_the_size_limit_parses_quickly(name: str) -> None:
    started = time.monotonic()
    state = parse_current(ADVERSARIAL[name])
    assert time.monotonic() - started < 5, "parsing must stay linear in the input"
    assert len(state.warnings) <= 10, "warnings stay bounded"


def test_multibyte_character_cut_at_the_limit_is_not_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    head = b"## Status\nidle\n## Notes\n"
    filler = b"x" * (MAX_CURRENT_BYTES - len(head) - 1)
    path.write_bytes(head + filler + "é".encode() * 10)  # the limit falls inside the first é
    state = read_current(path)
    assert state.status == "idle"
    assert not any("UTF-8" in w for w in state.warnings)


def test_read_directory(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.mkdir()
    state = read_current(path)
    assert state.status == "unknown"
    assert any("directory" in w for w in state.warnings)


def test_read_fifo_does_not_hang(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    os.mkfifo(path)
    state = read_current(path)
    assert state.status == "unknown"
    assert any("regular file" in w for w in state.warnings)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_read_permission_denied(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text(SEED)
    path.chmod(0)
    state = read_current(path)
    assert state.status == "unknown"
    assert any("Permission denied" in w for w in state.warnings)


# --- write_goal / write_status --------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_write_goal_creates_file_and_directory(tmp_path: Path) -> None:
    path = tmp_path / ".cstack" / "CURRENT.md"
    write_goal(path, "Add OAuth login")
    state = read_current(path)
    assert (state.status, state.task) == ("working", "Add OAuth login")
    assert (state.progress_total, state.blockers, state.warnings) == (0, (), ())
    assert leftovers(path.parent) == []


def test_write_goal_keeps_other_sections_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    original = SEED.replace("working", "idle", 1) + "\n## Notes\n  odd  spacing\t\n\n\n"
    path.write_text(original)
    write_goal(path, "A new goal\nover two lines")
    expected = original.replace("idle", "working", 1).replace(
        "Implementing user authentication module", "A new goal\nover two lines"
    )
    assert path.read_text() == expected
    assert leftovers(tmp_path) == []


def test_write_goal_keeps_crlf_bom_and_undecodable_bytes(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    original = ("\ufeff" + SEED.replace("\n", "\r\n")).encode() + b"## Raw\r\n\xff\xfe\r\n"
    path.write_bytes(original)
    write_goal(path, "line one\nline two")
    expected = original.replace(b"Implementing user authentication module", b"line one\r\nline two")
    assert path.read_bytes() == expected


def test_write_goal_adds_missing_sections(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text("# Current State\n\n## Progress\n- [x] a\n")
    write_goal(path, "goal")
    assert path.read_text() == (
        "# Current State\n\n## Status\nworking\n\n## Task\ngoal\n\n## Progress\n- [x] a\n"
    )
    path.write_text("## Status\nidle\n## Blockers\n- b\n")
    write_goal(path, "goal")
    assert path.read_text() == "## Status\nworking\n\n## Task\ngoal\n\n## Blockers\n- b\n"
    path.write_text("## Status")  # heading as the last line, no newline
    write_goal(path, "goal")
    assert path.read_text() == "## Status\nworking\n\n## Task\ngoal\n"


def test_write_goal_on_empty_file_uses_the_seed(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text("")
    write_goal(path, "goal")
    state = read_current(path)
    assert (state.status, state.task, state.warnings) == ("working", "goal", ())


def test_write_goal_escapes_heading_lines(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    goal = "Do this\n## Status\ndone\n  ## Blockers\n\\## already escaped"
    write_goal(path, goal)
    text = path.read_text()
    assert "\n\\## Status\n" in text  # the documented escape: one leading backslash
    state = parse_current(text)
    assert (state.status, state.task, state.blockers) == ("working", goal, ())


def test_write_goal_keeps_mode_and_writes_through_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_text(SEED)
    real.chmod(0o640)
    link = tmp_path / "CURRENT.md"
    link.symlink_to(real)
    write_goal(link, "via link")
    assert link.is_symlink()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert read_current(link).task == "via link"


def test_write_goal_rejects_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        write_goal(Path("/nonexistent/never/written"), "a\x00b")


def test_write_goal_on_read_only_workspace_raises_oserror(tmp_path: Path) -> None:
    """A real read-only filesystem: as root (where modes do not stop writes) the workspace is
    bind-mounted read-only in a private mount namespace and the write runs in that child."""
    workspace = tmp_path / "ws"
    (workspace / ".cstack").mkdir(parents=True)
    (workspace / ".cstack" / "CURRENT.md").write_text(SEED)
    if os.geteuid() != 0:
        (workspace / ".cstack").chmod(0o555)
        try:
            with pytest.raises(OSError):
                write_goal(workspace / ".cstack" / "CURRENT.md", "new")
            with pytest.raises(OSError):
                write_goal(workspace / "other" / "CURRENT.md", "new")
        finally:
            (workspace / ".cstack").chmod(0o755)
        assert (workspace / ".cstack" / "CURRENT.md").read_text() == SEED
        return
    require_executable("unshare", "util-linux: a read-only mount as root")
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        from sidecar.workspace.cstack_files import write_goal
        for target in (".cstack/CURRENT.md", "other/CURRENT.md"):
            try:
                write_goal(Path(sys.argv[1]) / target, "new")
            except OSError as exc:
                print("OSError", exc.errno)
            else:
                print("written")
    """)
    script = 'mount --bind -o ro "$1" "$1" && exec "$2" -c "$3" "$1"'
    result = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", workspace, sys.executable, code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0 and "mount" in result.stderr:
        pytest.skip(f"cannot make a read-only mount here: {result.stderr.strip()}")
    assert result.stdout.split("\n")[:2] == ["OSError 30", "OSError 30"], result  # EROFS
    assert (workspace / ".cstack" / "CURRENT.md").read_text() == SEED
    assert not (workspace / "other").exists()


def test_write_status_needs_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / ".cstack" / "CURRENT.md"
    assert write_status(path, "killed") is False
    assert not path.exists()
    assert not path.parent.exists()


def test_write_status_changes_only_the_status(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text(SEED)
    assert write_status(path, "killed") is True
    assert path.read_text() == SEED.replace("## Status\nworking", "## Status\nkilled")
    assert read_current(path).status == "killed"
    assert leftovers(tmp_path) == []


def test_write_status_replaces_decorated_status_and_inserts_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text("## Status\n\n**Working** since 9am\n\n## Task\nx\n")
    write_status(path, "done")
    assert path.read_text() == "## Status\n\ndone\n\n## Task\nx\n"
    path.write_text("# Title\n## Task\nx")
    write_status(path, "killed")
    assert path.read_text() == "# Title\n\n## Status\nkilled\n\n## Task\nx"


def test_write_status_rejects_unknown_values(tmp_path: Path) -> None:
    path = tmp_path / "CURRENT.md"
    path.write_text(SEED)
    for bad in ("unknown", "paused", "Killed"):
        with pytest.raises(ValueError, match="status"):
            write_status(path, bad)
    assert path.read_text() == SEED


# --- properties -----------------------------------------------------------------------------

section_names = st.sampled_from(
    ["Status", "STATUS", "Task", "Current Task", "Progress", "Blockers", "Next Steps", "Notes", ""]
)
body_lines = st.one_of(
    st.sampled_from(
        ["working", "**done**", "bogus", "(none)", "- [x] a", "* [ ] b", "1. step", "---", ""]
    ),
    st.text(max_size=30).map(lambda s: s.replace("\n", " ")),
)
section_like_lines = st.one_of(
    section_names.map(lambda n: f"## {n}"),
    st.builds(
        lambda pre, n: f"{pre}{n}",
        st.sampled_from(["#", "###", " ##", "\\##", "##\t"]),
        section_names,
    ),
    body_lines,
)
section_like_text = st.builds(
    lambda lines, eol, bom: ("\ufeff" if bom else "") + eol.join(lines),
    st.lists(section_like_lines, max_size=40),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.booleans(),
)


def check_state(state: CurrentState) -> None:
    assert state.status in {"idle", "working", "blocked", "done", "killed", "unknown"}
    assert 0 <= state.progress_completed <= state.progress_total
    assert all(isinstance(w, str) for w in state.warnings)


@given(st.text())
def test_parse_current_never_raises_on_arbitrary_text(text: str) -> None:
    check_state(parse_current(text))


@given(section_like_text)
def test_parse_current_never_raises_on_section_like_text(text: str) -> None:
    check_state(parse_current(text))


goals = st.one_of(st.text(), section_like_text).filter(lambda s: "\x00" not in s)
existing_files = st.one_of(st.none(), st.just(SEED), section_like_text)


def expected_task(goal: str) -> str | None:
    """The documented normalisation: CRLF -> LF, surrounding whitespace stripped."""
    return "\n".join(line.rstrip("\r") for line in goal.split("\n")).strip() or None


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(goal=goals, existing=existing_files)
def test_write_goal_round_trips_any_goal(goal: str, existing: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ".cstack" / "CURRENT.md"
        if existing is not None:
            path.parent.mkdir()
            path.write_text(existing, newline="")
        write_goal(path, goal)
        state = parse_current(path.read_bytes().decode("utf-8"))
        assert state.task == expected_task(goal)
        assert state.status == "working"
