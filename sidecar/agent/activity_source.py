"""Pane activity as the agent's state source, for CLIs without hooks: output means a turn is
under way (`working`); a pane quiet for `quiet` seconds means `idle`, unless it is blank (the
CLI has drawn nothing yet: text typed there is lost) or not seen drawn (the last look tmux did
not answer, on a loaded machine): then the screen is looked at again, since a quiet pane brings
no other look. One timer, armed only while output may still be followed by quiet, or while the
pane is not seen drawn: an idle sleeve runs none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sidecar.agent.machine import AgentMachine
from sidecar.pane.control import SAMPLE


class ActivitySource:
    def __init__(
        self,
        machine: AgentMachine,
        quiet_for: Callable[[], float],
        quiet: float,
        on_idle: Callable[[], None],
        *,
        drawn: Callable[[], bool],
        look: Callable[[], None],
    ) -> None:
        self.machine = machine
        self.drawn = drawn  # whether the screen, when last looked at, showed anything
        self.look = look  # look at the screen now (what it shows sets `drawn`)
        self.quiet_for = quiet_for  # seconds since the pane last wrote (`PaneActivity`)
        self.quiet = quiet
        self.on_idle = on_idle  # the agent went idle: an inbox notice may be due
        self.active = False  # whether the CLI that runs uses this source
        self._launched_at = time.monotonic()
        self._timer: asyncio.TimerHandle | None = None

    def launched(self, *, active: bool) -> None:
        """A CLI was launched; `active`: it uses this source."""
        self.active = active
        self._launched_at = time.monotonic()

    def adopted(self, *, active: bool) -> None:
        """A running CLI this supervisor did not launch: quiet is counted from our own start."""
        self.active = active

    def running(self) -> None:
        """The CLI runs: idle once it has been quiet long enough."""
        if self.active:
            self._arm(self.quiet)

    def output(self) -> None:
        """The pane wrote something."""
        if not self.active:
            return
        self.machine.report("working")
        if self._timer is None:
            self._arm(self.quiet)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self.active:
            return
        since = min(self.quiet_for(), time.monotonic() - self._launched_at)
        # Output is known to within SAMPLE seconds (`sidecar.pane.control`): half of it is slack.
        if since + SAMPLE / 2 >= self.quiet:
            if not self.drawn():  # blank, or not seen yet: look, and ask again later
                self.look()
                self._arm(self.quiet)
                return
            self.machine.report("idle")
            self.on_idle()
        else:
            self._arm(self.quiet - since)
