"""The screen as a source of the agent's state: looks at the CLI's pane when what it shows may
have changed, reads it with the CLI's recognizer and tells the agent machine, which combines it
with what the hooks or the pane's activity say (`sidecar.agent.machine`).

When it looks: once the pane has settled after output (SETTLE seconds with none: a CLI that
paints continuously, a spinner, never settles, and stays `working`), after a source spoke, when
the control client (re)attaches, and at once on every output while a prompt for a person is up
(so that an answered or dismissed prompt is noticed as it leaves, an announced one as it is
drawn). A look before the pane settled counts only a whole frame (`Reading.complete`): a CLI
caught halfway through a redraw shows shapes it never meant. Never on a timer while the pane is
quiet. A look is two commands on the control client, no process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.screens import Reading, Recognizer, generic
from sidecar.pane.protocol import ControlError
from sidecar.pane.screen import Screen

log = logging.getLogger(__name__)

# Seconds without output before the pane counts as settled. The activity client hears of output
# at most every SAMPLE (0.25 s) while it goes on, so a gap longer than that is a real pause.
SETTLE = 0.4
# Before the CLI has said anything: looks on output, each followed by up to EAGER_LOOKS more,
# EAGER_AGAIN apart, until one reads a whole frame (a first-start dialog drawn in one burst is
# `waiting` within ~0.1 s, not after the pane settles). Bounded: only at start, only after output.
EAGER_LOOKS, EAGER_AGAIN = 15, 0.02


class ScreenSource:
    def __init__(self, machine: AgentMachine, look: Callable[[], Awaitable[Screen]]) -> None:
        self.machine = machine
        self._look = look
        self.recognizer: Recognizer = generic
        self.known = False  # whether the recognizer is the running CLI's own
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        # Asked for while a look was under way: one more look after it, "eager" (only a whole
        # frame counts) unless a full look was asked for; None: none.
        self._pending: str | None = None
        self._eager_left = 0
        self._soon: asyncio.TimerHandle | None = None
        self.drawn = False  # whether the last look found anything on screen

    async def read_now(self) -> Reading:
        """The screen as the running CLI's recognizer reads it now (ControlError: tmux cannot
        be asked)."""
        return (await self.look_and_read())[1]

    async def look_and_read(self) -> tuple[Screen, Reading]:
        """The screen now, and how the running CLI's recognizer reads it (ControlError: tmux
        cannot be asked)."""
        screen = await self._look()
        return screen, self.recognizer(screen)

    def use(self, cli: CLIDef) -> None:
        """`cli` runs now: its screen is read with its own knowledge, else the generic one."""
        known = cli.knowledge.screen if cli.knowledge is not None else None
        pattern = cli.prompt_pattern
        self.recognizer = known.read if known else (lambda screen: generic(screen, pattern))
        self.known = known is not None

    def output(self, at: float) -> None:
        """The pane wrote (last at `at`, time.monotonic(): a notice may come a while after, at the
        end of the activity client's SAMPLE window; while a prompt is up it tells every output):
        look once it settles; and now if a person's prompt is up (has it gone, or, announced by
        the source, appeared?), or the CLI has not said anything yet (a first-start dialog).
        What such an early look reads counts only if it is a whole frame of a shape the CLI's
        knowledge recognizes (`Reading.complete`); the rest waits for the pane to settle."""
        self._settle_later(SETTLE - (time.monotonic() - at))
        if self.machine.prompt_up:
            # When it appeared is when its keys can be sent (`sidecar.agent.input_delivery`);
            # a frame half drawn (Gemini CLI's tool box before its spinner or its question) must
            # neither draw it nor take it away.
            self.look_now(eager=True)
        elif self.machine.state == "starting":
            self._eager_left = EAGER_LOOKS
            self.look_now(eager=True)

    def spoke(self) -> None:
        """A source reported: check the screen once the pane is settled."""
        if self._timer is None:
            self._settle_later()

    def attached(self) -> None:
        """The control client attached (a launch, a heal, a supervisor taking over): what is on
        screen is known only by looking."""
        self._settle_later()

    def stop(self) -> None:
        for handle in (self._timer, self._soon):
            if handle is not None:
                handle.cancel()
        self._timer = self._soon = None
        if self._task is not None:
            self._task.cancel()

    def _look_again_soon(self) -> None:
        """A frame caught while it was drawn: the rest of it may come during the activity
        client's pause (no output notice then), so look again shortly, a few times at most."""
        if self._eager_left <= 0 or self.machine.state != "starting":
            return
        self._eager_left -= 1
        self._soon = asyncio.get_running_loop().call_later(
            EAGER_AGAIN, lambda: self.look_now(eager=True)
        )

    def _settle_later(self, delay: float = SETTLE) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(max(0.0, delay), self._settled)

    def _settled(self) -> None:
        self._timer = None
        self.look_now()

    def look_now(self, *, eager: bool = False) -> None:
        if self._task is not None and not self._task.done():
            self._pending = "eager" if eager and self._pending != "full" else "full"
            return
        self._task = asyncio.create_task(self._read(eager), name="screen-look")

    async def _read(self, eager: bool) -> None:
        while True:
            try:
                screen = await self._look()
            except ControlError:
                return  # tmux away (a heal, a restart): the last state stands; logged once
            reading = None
            self.drawn = any(line.strip() for line in screen.lines)
            if self.drawn:  # a blank pane has drawn nothing yet
                reading = self.recognizer(screen)
                if reading.complete or not eager:
                    self.machine.screen(reading)
            if eager and (reading is None or not reading.complete):
                self._look_again_soon()
            if self._pending is None:
                return
            eager, self._pending = self._pending == "eager", None
