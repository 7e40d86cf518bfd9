"""Screen recognition of Codex CLI, Gemini CLI and opencode, on their real screens: every file
under tests/screens/<cli>/ is a `tmux capture-pane -p` of the pinned CLI (first-start dialogs,
its prompt empty and typed, work in progress, a permission prompt from a loopback stub that
answers with a shell tool call: tests/e2e/tool_stub.py), headed
`# rows cols cursor_row cursor_col seen [reason]`. Hand-made variants prove the rule that a
shape never seen is a dialog, never the prompt.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.agent.clis import codex, gemini_cli, opencode
from sidecar.agent.screens import Reading, Recognizer, Seen
from sidecar.pane.screen import Screen
from tests.screentools import SCREENS, load_screen, screen_of

RECOGNIZERS: dict[str, Recognizer] = {
    known.name: known.screen.read
    for known in (codex.CLI, gemini_cli.CLI, opencode.CLI)
    if known.screen is not None
}


FIXTURES = sorted(p for cli in RECOGNIZERS for p in (SCREENS / cli).glob("*.txt"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_captured_screen_reads_as_recorded(path: Path) -> None:
    screen, expected = load_screen(path)
    reading = RECOGNIZERS[path.parent.name](screen)
    assert reading.seen == expected.seen
    if expected.reason is not None:
        assert reading.reason == expected.reason


@pytest.mark.parametrize(
    ("cli", "name"),
    [("codex", "permission-command"), ("gemini-cli", "permission-shell"),
     ("opencode", "permission-shell")],
)  # fmt: skip
def test_a_permission_prompt_offers_the_same_answers_at_every_size(cli: str, name: str) -> None:
    """The permission prompt captured at 80x24 and 250x60 (Codex's longest choice wraps at 80
    columns) is whole and offers the choices, labels and keys it offers at 200x50."""
    whole = RECOGNIZERS[cli](load_screen(SCREENS / cli / f"{name}.txt")[0])
    assert whole.complete and len(whole.choices) == 3, whole
    for size in ("80x24", "250x60"):
        reading = RECOGNIZERS[cli](load_screen(SCREENS / cli / f"{name}-{size}.txt")[0])
        assert reading.complete, size
        assert reading.choices == whole.choices, size


def test_every_cli_has_each_kind_of_screen() -> None:
    """Each CLI's fixtures cover its prompt, work, a permission prompt and a dialog: what its
    package declares its screen shows (the keys it declares answer that permission prompt)."""
    for known in (codex.CLI, gemini_cli.CLI, opencode.CLI):
        seen = {load_screen(p)[1].seen for p in (SCREENS / known.name).glob("*.txt")}
        assert seen == set(Seen), known.name
        assert known.screen is not None and known.screen.shows == seen, known.name


# ---- shapes never seen: a dialog, never the prompt ------------------------------------------


@pytest.mark.parametrize("cli", sorted(RECOGNIZERS))
def test_empty_screen_with_one_line_is_a_dialog(cli: str) -> None:
    screen = screen_of("", "", "  Loading workspace settings failed: press any key", cursor=(2, 0))
    reading = RECOGNIZERS[cli](screen)
    assert reading == Reading(Seen.DIALOG, "Loading workspace settings failed: press any key")


@pytest.mark.parametrize("cli", sorted(RECOGNIZERS))
def test_blank_screen_is_a_dialog(cli: str) -> None:
    assert RECOGNIZERS[cli](screen_of()).seen is Seen.DIALOG


QUESTION = ["  Do you want to enable usage statistics?", "", "› 1. Yes", "  2. No"]


def replaced(cli: str, name: str, start: str, count: int, new: list[str]) -> Screen:
    """The fixture's screen with `count` lines from the first starting with `start` replaced
    by `new`, the cursor parked at the bottom right (as the CLIs do when a dialog is up)."""
    screen, _ = load_screen(SCREENS / cli / f"{name}.txt")
    lines = list(screen.lines)
    at = next(i for i, line in enumerate(lines) if line.startswith(start))
    lines[at : at + count] = (new + [""] * count)[: max(count, len(new))]
    lines = (lines + [""] * screen.rows)[: screen.rows]
    return replace(screen, lines=tuple(lines), cursor_row=screen.rows - 1, cursor_col=0)


@pytest.mark.parametrize(
    ("cli", "name", "start", "count"),
    [
        ("codex", "prompt-empty", "› Ask Codex", 4),
        ("gemini-cli", "prompt-empty", "─────", 7),
        ("opencode", "prompt-empty", " " * 63 + "┃", 6),
    ],
)
def test_prompt_area_replaced_by_a_question_is_a_dialog(
    cli: str, name: str, start: str, count: int
) -> None:
    screen = replaced(cli, name, start, count, QUESTION)
    reading = RECOGNIZERS[cli](screen)
    assert (reading.seen, reading.reason) == (
        Seen.DIALOG,
        "Do you want to enable usage statistics?",
    )


@pytest.mark.parametrize("cli", sorted(RECOGNIZERS))
def test_prompt_with_the_cursor_elsewhere_is_not_the_prompt(cli: str) -> None:
    """The prompt's frame left on screen behind something that took the cursor (a dialog
    drawn without erasing it) is not taken for the prompt."""
    screen, expected = load_screen(SCREENS / cli / "prompt-empty.txt")
    assert expected.seen is Seen.PROMPT
    moved = replace(screen, cursor_row=0, cursor_col=0)
    assert RECOGNIZERS[cli](moved).seen is Seen.DIALOG


def test_codex_transcript_prompt_line_is_not_its_composer() -> None:
    """Codex repeats each prompt in its transcript with the composer's mark: with the cursor
    on one of those (a popup parked it there) the screen is not the prompt."""
    screen, _ = load_screen(SCREENS / "codex" / "warnings.txt")
    row = next(i for i, line in enumerate(screen.lines) if line.startswith("› create"))
    moved = replace(screen, cursor_row=row, cursor_col=4)
    assert codex.read_screen(moved).seen is Seen.DIALOG


def test_gemini_transcript_prompt_line_is_not_its_input() -> None:
    """Gemini CLI repeats each prompt as a ' > ' line with no rule above it."""
    screen, _ = load_screen(SCREENS / "gemini-cli" / "theme.txt")
    row = next(i for i, line in enumerate(screen.lines) if line.startswith(" > create"))
    moved = replace(screen, cursor_row=row, cursor_col=5)
    assert gemini_cli.read_screen(moved).seen is Seen.DIALOG


def test_gemini_running_its_hooks_is_working_wherever_the_cursor_is() -> None:
    """While its hooks run Gemini CLI shows "Executing Hooks: ..." where the spinner stands:
    work, whether the cursor is in its input (at the start its SessionStart hooks run after the
    prompt is drawn, and an Enter typed then is a newline, not a submission) or parked outside it
    (seen in a test run on 0.61; not the start's numbered tips read as a dialog). Without the
    line, the same screens are the prompt and a dialog."""
    screen, _ = load_screen(SCREENS / "gemini-cli" / "prompt-empty.txt")
    lines = list(screen.lines)
    rule = next(i for i, line in enumerate(lines) if line.startswith("─────"))
    lines[rule - 1] = "  Executing Hooks: sidecar (1/2), mine (2/2)"
    hooks = replace(screen, lines=tuple(lines))
    assert gemini_cli.read_screen(hooks).seen is Seen.WORKING
    away = replace(hooks, cursor_row=0, cursor_col=0)
    assert gemini_cli.read_screen(away).seen is Seen.WORKING
    assert gemini_cli.read_screen(screen).seen is Seen.PROMPT
    assert gemini_cli.read_screen(replace(screen, cursor_row=0, cursor_col=0)).seen is Seen.DIALOG
