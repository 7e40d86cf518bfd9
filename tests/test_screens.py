"""Screen recognition (pure): Claude Code's screens as captured from the real CLI
(tests/screens/claude-code/, header: rows cols cursor_row cursor_col seen [reason]), the generic
reading, shapes never seen before, wide and combining characters; and how the agent machine
combines the screen with what the CLI's source says."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from sidecar.agent.activity_source import ActivitySource
from sidecar.agent.clis import claude_code
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.screen_source import SETTLE, ScreenSource
from sidecar.agent.screens import Reading, Seen, Typed, generic, text_of, typed_at
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.pane.protocol import NoAnswer
from sidecar.pane.screen import Screen
from tests.harness import wait_for_async
from tests.screentools import SCREENS, load_screen, screen_of


@pytest.mark.parametrize(
    "path", sorted((SCREENS / "claude-code").glob("*.txt")), ids=lambda p: p.stem
)
def test_claude_codes_captured_screens(path: Path) -> None:
    screen, expected = load_screen(path)
    reading = claude_code.read_screen(screen)
    assert reading.seen is expected.seen, reading
    if expected.reason is not None:
        assert reading.reason == expected.reason


def test_a_claude_screen_never_seen_before_is_a_dialog_never_the_prompt() -> None:
    # The input box replaced by a question of a kind the recognizer does not know.
    screen, _ = load_screen(SCREENS / "claude-code" / "prompt-empty.txt")
    lines = list(screen.lines)
    box = next(i for i, line in enumerate(lines) if line.startswith("❯"))
    lines[box - 1 : box + 2] = ["", " Connect the new MCP server 'files'?", "  Allow once  Deny"]
    reading = claude_code.read_screen(Screen(screen.rows, screen.cols, tuple(lines), box, 2))
    assert reading == Reading(Seen.DIALOG, "Connect the new MCP server 'files'?")
    # An empty screen but for one line of text.
    assert claude_code.read_screen(screen_of("Signing in...")) == Reading(
        Seen.DIALOG, "Signing in..."
    )


@pytest.mark.parametrize(
    ("lines", "seen", "reason"),
    [
        (["user@box:~/ws$ "], Seen.PROMPT, None),
        (["$ make", "done", "$ "], Seen.PROMPT, None),
        (["Delete the build directory? [y/N] "], Seen.DIALOG, "Delete the build directory? [y/N]"),
        (["Overwrite config.yaml (yes/no)? "], Seen.DIALOG, "Overwrite config.yaml (yes/no)?"),
        (["Continue [Y/n] "], Seen.DIALOG, "Continue [Y/n]"),
        # What is typed after the question does not change it.
        (["Delete the build directory? [y/N] n"], Seen.DIALOG, "Delete the build directory? [y/N]"),
        (["Pick a theme", "❯ 1. Dark", "  2. Light", ""], Seen.DIALOG, "Pick a theme"),
        (["Choose:", "1) yes", "2) no", "#? "], Seen.DIALOG, "Choose:"),
        # An old menu scrolled above a later prompt is history.
        (["Pick a theme", "❯ 1. Dark", "  2. Light", "chose 1", "ready> "], Seen.PROMPT, None),
    ],
)
def test_the_generic_reading(lines: list[str], seen: Seen, reason: str | None) -> None:
    reading = generic(screen_of(*lines))
    assert (reading.seen, reading.reason) == (seen, reason)


@pytest.mark.parametrize(
    ("lines", "offered"),
    [
        (["Delete the build directory? [y/N] "], [("y", ("y", "Enter")), ("n", ("n", "Enter"))]),
        (["Continue (Y/n)? "], [("y", ("y", "Enter")), ("n", ("n", "Enter"))]),
        # Words are typed, then submitted.
        (["Overwrite config.yaml (yes/no)? "], [("yes", "yes"), ("no", "no")]),
        # A marked menu: Up or Down from the marked choice, then Enter.
        (["Pick a theme", "  1. Dark", "❯ 2. Light", "  3. Solar", ""],
         [("Dark", ("Up", "Enter")), ("Light", ("Enter",)), ("Solar", ("Down", "Enter"))]),
        # bash's select: a digit, then Enter.
        (["Choose:", "1) yes", "2) no", "#? "], [("yes", ("1", "Enter")), ("no", ("2", "Enter"))]),
        # A question without its answers written out offers none: the keys are the person's.
        (["Proceed? "], []),
    ],
)  # fmt: skip
def test_the_generic_reading_offers_the_answers_the_question_writes(
    lines: list[str], offered: list[tuple[str, object]]
) -> None:
    choices = generic(screen_of(*lines)).choices
    assert [(c.label, c.text if c.text else c.keys) for c in choices] == offered


def test_the_generic_reading_with_a_prompt_pattern() -> None:
    pattern = re.compile(r"^ready>")
    assert generic(screen_of("ready>"), pattern).seen is Seen.PROMPT
    reading = generic(screen_of("Sign in with your browser", "Press Enter"), pattern)
    assert (reading.seen, reading.reason) == (Seen.DIALOG, "Sign in with your browser")


def test_fifty_lines_of_wide_and_combining_characters() -> None:
    wide = "漢字かな交じり文" * 12 + "e\u0301"
    lines = [wide] * 49 + ["\u202eamp? 全角？ "]
    for read in (generic, claude_code.read_screen):
        reading = read(screen_of(*lines))
        assert reading.seen in (Seen.PROMPT, Seen.DIALOG)
        assert reading.reason is None or "\n" not in reading.reason
        assert reading.reason is None or len(reading.reason) <= 300


# ---- the machine: the source's word, as the screen confirms or corrects it ------------------


def running(source: str) -> AgentMachine:
    machine = AgentMachine(EventBus())
    machine.launched(source)
    machine.process_changed(ProcState.RUNNING)
    return machine


PROMPT, WORKING = Reading(Seen.PROMPT), Reading(Seen.WORKING)
PERMISSION = Reading(Seen.PERMISSION, "Bash command: rm -rf build")
TRUST = Reading(Seen.DIALOG, "Do you trust this folder?")


def test_a_dialog_no_hook_reports_is_waiting_and_its_answer_idle() -> None:
    machine = running("hooks")
    machine.screen(TRUST)
    assert (machine.state, machine.status().reason) == ("waiting", TRUST.reason)
    machine.screen(PROMPT)
    assert machine.state == "idle"


def test_idle_from_the_hooks_is_not_reported_over_a_dialog() -> None:
    machine = running("hooks")
    machine.report("idle")
    machine.screen(TRUST)
    assert machine.state == "waiting"


def test_a_permission_prompt_announced_before_it_is_drawn() -> None:
    machine = running("hooks")
    machine.report("working")
    machine.report("waiting", "permission for Bash: rm -rf build")
    # The hook comes first; the screen still shows the spinner: the hook stands.
    machine.screen(WORKING)
    assert machine.state == "waiting"
    machine.screen(PERMISSION)
    assert machine.status().reason == "permission for Bash: rm -rf build"  # the hook's, exact
    # Answered: the prompt gives way to the tool at work.
    machine.screen(WORKING)
    assert machine.state == "working"


def test_a_dismissed_permission_prompt_is_idle() -> None:
    machine = running("hooks")
    machine.report("waiting", "permission for Bash: rm -rf build")
    machine.screen(PERMISSION)
    machine.screen(PROMPT)
    assert (machine.state, machine.status().reason) == ("idle", None)


def test_a_hook_after_a_look_is_the_latest_word() -> None:
    machine = running("hooks")
    machine.screen(PROMPT)
    assert machine.state == "idle"  # starting, read off the screen
    machine.report("working")
    assert machine.state == "working"


def test_activity_keeps_what_the_screen_showed_when_it_goes_quiet() -> None:
    """Activity's `idle` comes from the same pane the screen was read from: a dialog seen on
    it stays `waiting` (no idle-then-waiting flap)."""
    machine = running("activity")
    changes: list[str] = []
    machine.report("working")
    machine.screen(Reading(Seen.DIALOG, "Delete it? [y/N]"))
    machine.bus.publish = lambda event: changes.append(event.state)  # type: ignore[method-assign,attr-defined]
    machine.report("idle")
    assert machine.state == "waiting"
    assert changes == []


def test_a_dialog_an_exited_cli_left_on_screen_is_no_prompt_up() -> None:
    """While a prompt is up the control client tells every output; a CLI that exited answers
    nothing, so what it left on screen does not count (with it, 3 of 15 runs of the fresh-home
    test found the control client gone when they asked for the screen)."""
    machine = running("hooks")
    machine.screen(TRUST)
    assert machine.prompt_up
    machine.process_changed(ProcState.STOPPED)
    assert machine.screen_needs_person and not machine.prompt_up


def test_a_cli_not_running_is_exited_whatever_its_screen() -> None:
    machine = running("activity")
    machine.screen(TRUST)
    machine.process_changed(ProcState.EXITED)
    assert machine.state == "exited"


async def test_a_look_tmux_does_not_answer_keeps_the_last_state() -> None:
    """tmux not answering (stopped, or restarting in a heal) is faked at the look itself, the
    seam where the control client gives up: the state stands. The real path (a stopped tmux
    server, one log line) is tests/test_screen.py's."""
    machine = running("activity")
    machine.report("working")
    machine.screen(Reading(Seen.DIALOG, "Delete it? [y/N]"))
    looks = 0

    async def look() -> Screen:
        nonlocal looks
        looks += 1
        msg = "tmux did not answer within 1 s"
        raise NoAnswer(msg)

    source = ScreenSource(machine, look)
    source.look_now()
    assert source._task is not None
    await source._task
    assert looks == 1
    assert (machine.state, machine.status().reason) == ("waiting", "Delete it? [y/N]")


async def test_a_quiet_pane_whose_look_went_unanswered_is_looked_at_again_and_goes_idle() -> None:
    """A look tmux does not answer in time (a loaded machine) leaves the pane not seen drawn,
    and a quiet pane brings no other look: the activity source's quiet check looks again, and
    the agent goes idle once the screen is seen drawn. (Faked at the look, as above: a real
    tmux cannot be made to miss one deadline on demand.)"""
    machine = running("activity")
    prompt = screen_of("user@sleeve:/workspace$ ")
    looks = 0

    async def look() -> Screen:
        nonlocal looks
        looks += 1
        if looks == 1:
            msg = "tmux did not answer within 1 s"
            raise NoAnswer(msg)
        return prompt

    source = ScreenSource(machine, look)
    quiet = ActivitySource(
        machine, lambda: 60.0, 0.05, lambda: None, drawn=lambda: source.drawn, look=source.look_now
    )
    quiet.launched(active=True)
    source.look_now()  # the look when the control client attached: unanswered
    assert source._task is not None
    await source._task
    assert not source.drawn
    quiet.running()
    await wait_for_async(lambda: machine.state == "idle", 5, what="the agent idle")
    assert looks == 2
    quiet.stop()
    source.stop()


def test_claude_codes_fixtures_show_what_its_package_declares() -> None:
    seen = {load_screen(p)[1].seen for p in (SCREENS / "claude-code").glob("*.txt")}
    assert claude_code.CLI.screen is not None and claude_code.CLI.screen.shows == seen


async def test_an_early_look_counts_only_a_whole_frame_of_a_known_shape() -> None:
    """While the CLI has said nothing yet, output makes the sidecar look at once (a first-start
    dialog is `waiting` without waiting for the pane to settle), but only a complete reading
    counts then: a frame caught half-drawn waits for the settled look. The look is fed the
    real CLI's captured screens (the seam: what tmux would answer)."""
    trust, _ = load_screen(SCREENS / "claude-code" / "trust-folder.txt")
    typed, _ = load_screen(SCREENS / "claude-code" / "prompt-typed.txt")
    for shown, expected in ((typed, "starting"), (trust, "waiting")):
        machine = running("hooks")

        async def look(shown: Screen = shown) -> Screen:
            return shown

        source = ScreenSource(machine, look)
        source.use(CLIDef("claude-code", ("claude",), knowledge=claude_code.CLI))
        source.output(time.monotonic())
        assert source._task is not None
        await source._task
        source.stop()
        assert machine.state == expected


def test_a_frame_is_stripped_but_a_commands_pipes_are_kept() -> None:
    assert text_of("│  $ echo a | tee b.txt   │") == "$ echo a | tee b.txt"
    assert text_of("┃ ls ┃ wc") == "ls wc"  # a box-drawing bar inside is frame
    assert text_of("| a | b |") == "a | b"


def test_where_a_typed_prompt_stands_on_the_real_clis_screens() -> None:
    """Gemini CLI 0.61 with a prompt typed, its Enter not read yet; and with the Enter taken as
    a newline (captured when a busy machine ran its guard after a paste late)."""
    typed, _ = load_screen(SCREENS / "gemini-cli" / "prompt-typed.txt")
    assert typed_at(typed, "create a file please") is Typed.AT_CURSOR
    newline, _ = load_screen(SCREENS / "gemini-cli" / "prompt-newline.txt")
    assert typed_at(newline, "run it") is Typed.NEWLINE
    assert typed_at(newline, "first line\nrun it\n") is Typed.NEWLINE  # its last line counts
    for other in ("run", "walk it", "", "\n"):
        assert typed_at(newline, other) is None, other
    empty, _ = load_screen(SCREENS / "gemini-cli" / "prompt-empty.txt")
    assert typed_at(empty, "run it") is None
    claude, _ = load_screen(SCREENS / "claude-code" / "prompt-typed.txt")
    assert typed_at(claude, "no such prompt") is None


def test_where_a_typed_prompt_stands_when_the_input_wrapped_it() -> None:
    text = "please rename every file under src to snake case"
    wrapped = screen_of(" > please rename every file", "   under src to snake case", "")
    assert typed_at(wrapped, text) is Typed.NEWLINE
    # A short piece of the text ending a line above a blank one is no sign of it.
    by_chance = screen_of("some history: case", "", cursor=(1, 0))
    assert typed_at(by_chance, text) is None
    # The history shows a submitted prompt too, but not right above the input's blank line.
    taken = screen_of(f" > {text}", "", "─" * 40, " > ", cursor=(3, 3))
    assert typed_at(taken, text) is None
    assert typed_at(screen_of("╭────╮", f"│ > {text} │", "│    │", cursor=(2, 2)), text) is (
        Typed.NEWLINE
    )


async def test_the_pane_settles_from_its_last_output_not_from_the_notice() -> None:
    """The activity client may tell of output at the end of its SAMPLE window, naming when the
    pane last wrote: the look once the pane has settled is due SETTLE after that output, not
    after the notice (which made a dialog's `waiting` come ~0.25 s late)."""
    typed, _ = load_screen(SCREENS / "claude-code" / "prompt-typed.txt")

    async def look() -> Screen:
        return typed

    source = ScreenSource(running("hooks"), look)
    loop = asyncio.get_running_loop()
    source.output(time.monotonic() - SETTLE)  # told SETTLE after the pane wrote: due now
    assert source._timer is not None and source._timer.when() <= loop.time()
    source.output(time.monotonic())  # told at once: due SETTLE from now
    assert source._timer is not None and source._timer.when() >= loop.time() + SETTLE * 0.9
    source.stop()
