"""Half-drawn frames: while a prompt for a person is up the sidecar looks at every redraw, and
what such a look reads counts only if the CLI's recognizer saw the whole shape
(`Reading.complete`). The frames are the real CLIs' captures (tests/screens/<cli>/) cut where a
top-to-bottom redraw may be caught, and Gemini CLI's tool box before its spinner or its
question; the screen source is fed them in the order the CLI draws them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.agent.clis import claude_code, codex, gemini_cli, opencode
from sidecar.agent.knowledge import Knowledge
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.screen_source import ScreenSource
from sidecar.agent.screens import Reading, Seen, nonblank
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.pane.screen import Screen
from tests.screentools import SCREENS, load_screen

KNOWN: dict[str, Knowledge] = {
    cli.name: cli for cli in (claude_code.CLI, codex.CLI, gemini_cli.CLI, opencode.CLI)
}
GEMINI = SCREENS / "gemini-cli"


def read(cli: str, screen: Screen) -> Reading:
    known = KNOWN[cli].screen
    assert known is not None
    return known.read(screen)


def cut(screen: Screen, rows: int) -> Screen:
    """The frame as a redraw from the top leaves it when caught after `rows` rows: the rest
    erased, the cursor where the drawing stands."""
    lines = (*screen.lines[:rows], *[""] * (screen.rows - rows))
    return replace(screen, lines=lines, cursor_row=rows, cursor_col=0)


def whole_frames() -> Iterator[tuple[str, Path]]:
    """The captures read as a whole dialog or work: what begins or ends `waiting` while the
    sidecar looks at every redraw. (A cut of a prompt may be a whole shape of its own: Codex's
    prompt with its file popup, cut above the composer, is that popup's whole frame; the
    looks on every redraw happen only while a prompt for a person is up or the CLI starts.)"""
    for cli in sorted(KNOWN):
        for path in sorted((SCREENS / cli).glob("*.txt")):
            screen, _ = load_screen(path)
            reading = read(cli, screen)
            if reading.complete and reading.seen is not Seen.PROMPT:
                yield cli, path


@pytest.mark.parametrize(
    ("cli", "path"), list(whole_frames()), ids=lambda v: v if isinstance(v, str) else v.stem
)
def test_a_frame_cut_short_is_never_a_whole_frame_of_another_shape(cli: str, path: Path) -> None:
    """Every captured frame its recognizer calls whole, cut after each of its rows: a cut that
    still reads as whole reads as the whole frame does, the same question with the same
    answers (the shape was all there: its footer, its hints or its closing line)."""
    screen, _ = load_screen(path)
    whole = read(cli, screen)
    for rows in range(screen.rows):
        reading = read(cli, cut(screen, rows))
        if reading.complete:
            assert (reading.seen, reading.reason) == (whole.seen, whole.reason), rows
            assert reading.choices == whole.choices, rows


def gemini_tool_box(mark: str) -> Screen:
    """Gemini CLI's screen as a tool call is drawn, before its spinner or its confirmation:
    the transcript of tests/screens/gemini-cli/prompt-after-approval.txt down to the tool's
    closed box, its status mark `mark`, nothing under it yet."""
    screen, _ = load_screen(GEMINI / "prompt-after-approval.txt")
    box = next(i for i, line in enumerate(screen.lines) if "Shell touch stub-was-here" in line)
    end = next(i for i in range(box, screen.rows) if screen.lines[i].startswith("╰"))
    frame = cut(screen, end + 1)
    lines = list(frame.lines)
    lines[box] = lines[box].replace("✓", mark)
    return replace(frame, lines=tuple(lines))


@pytest.mark.parametrize("mark", ["o", "⠴", "✓"])
def test_geminis_tool_box_before_its_spinner_is_work_half_drawn(mark: str) -> None:
    """Its box alone (the Notification hook is awaited before the confirmation is drawn) is
    work, not a dialog, even on a look once the pane seemed settled; and never a whole frame."""
    reading = read("gemini-cli", gemini_tool_box(mark))
    assert reading == Reading(Seen.WORKING)


def test_geminis_box_headed_by_a_question_mark_stays_a_dialog() -> None:
    """Awaiting confirmation, a tool's box is headed "?", as a dialog's title may be: without
    its choices it is a dialog half drawn (never whole), not work."""
    reading = read("gemini-cli", gemini_tool_box("?"))
    assert reading.seen is Seen.DIALOG and not reading.complete


def test_geminis_hooks_line_caught_halfway_is_work() -> None:
    """The frame a look caught while 0.61 wrote its hooks line under the pending tool's box
    (seen in a run of the permission test: it read as a dialog named "o")."""
    frame = gemini_tool_box("o")
    lines = list(frame.lines)
    lines[frame.cursor_row] = " ⠴ Exe"
    reading = read("gemini-cli", replace(frame, lines=tuple(lines), cursor_col=6))
    assert reading == Reading(Seen.WORKING)


def test_geminis_confirmation_is_whole_only_once_its_box_is_closed() -> None:
    screen, _ = load_screen(GEMINI / "permission-shell.txt")
    closing = max(i for i, line in enumerate(screen.lines) if line.startswith("╰"))
    assert read("gemini-cli", screen).complete
    half = read("gemini-cli", cut(screen, closing))
    assert half.seen is Seen.PERMISSION and not half.complete


def hooked_gemini() -> AgentMachine:
    """Gemini CLI at work, its Notification hook just announced the confirmation."""
    machine = AgentMachine(EventBus())
    machine.launched("hooks")
    machine.process_changed(ProcState.RUNNING)
    machine.report("working")
    machine.report("waiting", "Shell: touch stub-was-here")
    return machine


async def test_an_announced_confirmation_is_drawn_by_whole_frames_only() -> None:
    """The looks on output while Gemini's confirmation is announced see its frames in order:
    the tool's box alone, the confirmation caught before its box is closed, the spinner, the
    whole confirmation, and after "1" the tool at work. The half-drawn ones neither draw the
    confirmation nor let the spinner end `waiting` (yesterday's flake: waiting -> working
    before the dialog was drawn); the whole one draws it, and the work after it ends it."""
    spinner, _ = load_screen(GEMINI / "working.txt")
    confirmation, _ = load_screen(GEMINI / "permission-shell.txt")
    closing = max(i for i, line in enumerate(confirmation.lines) if line.startswith("╰"))
    machine = hooked_gemini()
    shown = [spinner]
    seen: list[tuple[str, str | None]] = []

    async def look() -> Screen:
        return shown[0]

    source = ScreenSource(machine, look)
    source.use(CLIDef("gemini-cli", ("gemini",), knowledge=gemini_cli.CLI))
    drawn = (gemini_tool_box("o"), cut(confirmation, closing), spinner, confirmation, spinner)
    try:
        for frame in drawn:
            shown[0] = frame
            source.output(time.monotonic())  # the pane wrote: the settled look is not due
            assert source._task is not None
            await source._task
            seen.append((machine.state, machine.status().reason))
    finally:
        source.stop()
    waiting = ("waiting", "Shell: touch stub-was-here")
    assert seen == [waiting, waiting, waiting, waiting, ("working", None)]


async def test_a_look_that_takes_a_half_drawn_tool_box_for_settled_keeps_waiting() -> None:
    """The activity client's pause may hide output, so a look "once the pane settled" can
    still catch Gemini drawing: its tool box alone, then its spinner, keep an announced
    confirmation `waiting` (it was `working` in 1 of 6 runs of the permission test)."""
    spinner, _ = load_screen(GEMINI / "working.txt")
    machine = hooked_gemini()
    for frame in (gemini_tool_box("o"), spinner):
        machine.screen(read("gemini-cli", frame))  # what a settled look tells the machine
        assert (machine.state, machine.status().reason) == ("waiting", "Shell: touch stub-was-here")


def test_half_drawn_frames_of_every_cli_are_not_whole() -> None:
    """The frames a redraw leaves on its way, one per kind that says a prompt is up or gone:
    Claude Code's spinner without the input box under it, Codex's approval without its hints
    line, opencode's permission prompt without its buttons, Gemini's without its box closed;
    the permission prompts at 80x24 and 250x60 as well as 200x50."""
    cases = {("claude-code", "answered-spinner.txt"): "✢ Kerfuffling…"}
    for size in ("", "-80x24", "-250x60"):
        cases[("codex", f"permission-command{size}.txt")] = "Press enter to confirm"
        cases[("opencode", f"permission-shell{size}.txt")] = "Allow once"
        cases[("gemini-cli", f"permission-shell{size}.txt")] = "3. No, suggest changes"
    for (cli, name), upto in cases.items():
        screen, _ = load_screen(SCREENS / cli / name)
        at = next(i for i, line in enumerate(screen.lines) if upto in line)
        rows = at + 1 if cli in ("claude-code", "gemini-cli") else at
        half = read(cli, cut(screen, rows))
        assert read(cli, screen).complete, name
        assert not half.complete, (cli, name, nonblank(screen.lines[:rows])[-3:])
