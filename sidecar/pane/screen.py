"""The CLI pane's screen as a person attached sees it, and its size: asked of (and set in) tmux
through the control client the sidecar already runs (`PaneActivity.ask`), so a look costs two
commands on a pipe and no process. `parse_screen` is pure; `ScreenLook` logs a run of failed
looks once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sidecar.core.contract import TMUX_SESSION
from sidecar.pane.protocol import CommandFailed, ControlError, Reply
from sidecar.pane.tmux import PANE

log = logging.getLogger(__name__)

LOOK_TIMEOUT = 1.0  # seconds tmux gets to answer a look
TARGET = f"'{PANE}'"  # quoted: these command lines are parsed by tmux
# Size and cursor, then the text. Sent in one write, the two run back to back in tmux's command
# queue, before it reads from the pane again: both describe the same screen.
SIZE_FORMAT = "#{pane_width} #{pane_height} #{cursor_x} #{cursor_y}"
SIZE = f"display-message -p -t {TARGET} '{SIZE_FORMAT}'"
# The visible lines (tmux's default range) as text: no -e (escape sequences), no -C (octal
# escapes), no -J/-N (trailing spaces are trimmed, wrapped lines stay as drawn). A wide
# character's padding cell is skipped and combining characters stay in their cell, so the
# text is the pane's UTF-8. In control mode tmux writes it as it is: nothing is escaped.
CAPTURE = f"capture-pane -p -t {TARGET}"
LOOK = (SIZE, CAPTURE)
# The window (the session's only one) and its one pane are the same size.
WINDOW = f"{TMUX_SESSION}:0"
# The same with colours and attributes (-e: SGR escapes), for a recording's frame.
STYLED = (SIZE, f"capture-pane -p -e -t {TARGET}")

Ask = Callable[[Sequence[str], float], Awaitable[list[Reply]]]


@dataclass(frozen=True)
class Screen:
    rows: int
    cols: int
    lines: tuple[str, ...]  # exactly `rows` lines, trailing spaces trimmed
    cursor_row: int  # 0-based, from the top of the visible screen
    cursor_col: int


def parse_screen(size: Reply, capture: Reply) -> Screen:
    """The screen from the replies to LOOK. CommandFailed: tmux refused one (no such pane)."""
    for reply in (size, capture):
        if not reply.ok:
            msg = f"tmux: {reply.text() or 'error'}"
            raise CommandFailed(msg)
    try:
        cols, rows, col, row = (int(word) for word in size.text().split())
    except ValueError:
        msg = f"tmux answered the size with {size.text()!r}"
        raise CommandFailed(msg) from None
    lines = [line.decode("utf-8", "replace") for line in capture.lines[:rows]]
    lines += [""] * (rows - len(lines))
    return Screen(rows, cols, tuple(lines), row, col)


async def look_styled(ask: Ask) -> Screen:
    """The screen with its SGR escapes in the lines. Raises ControlError."""
    size, capture = await ask(STYLED, LOOK_TIMEOUT)
    return parse_screen(size, capture)


class ScreenLook:
    """Looks at the screen through `ask`. A look that fails raises ControlError; the first of a
    run of failures is logged, the rest are not until a look works again (a client asking every
    second while tmux is away writes one line, not one per request)."""

    def __init__(self, ask: Ask, on_size: Callable[[tuple[int, int]], None] | None = None) -> None:
        self.ask = ask
        self.on_size = on_size  # the size (columns, rows) each look and resize finds
        self._failing = False

    async def resize(self, cols: int, rows: int) -> tuple[int, int]:
        """Make the window `cols` x `rows` (numbers, so nothing but digits reaches tmux's
        parser); the size tmux then reports. ControlError when tmux cannot be asked."""
        resize = f"resize-window -t {WINDOW} -x {int(cols)} -y {int(rows)}"
        done, size = await self.ask((resize, SIZE), LOOK_TIMEOUT)
        for reply in (done, size):
            if not reply.ok:
                msg = f"tmux: {reply.text() or 'error'}"
                raise CommandFailed(msg)
        try:
            found = tuple(int(word) for word in size.text().split()[:2])
        except ValueError:
            msg = f"tmux answered the size with {size.text()!r}"
            raise CommandFailed(msg) from None
        width, height = found
        if self.on_size is not None:
            self.on_size((width, height))
        return width, height

    async def look(self) -> Screen:
        try:
            size, capture = await self.ask(LOOK, LOOK_TIMEOUT)
            screen = parse_screen(size, capture)
        except ControlError as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot look at the CLI's screen: %s (not logged again until it works)", exc
                )
            raise
        if self._failing:
            self._failing = False
            log.info("looking at the CLI's screen works again")
        if self.on_size is not None:
            self.on_size((screen.cols, screen.rows))
        return screen
