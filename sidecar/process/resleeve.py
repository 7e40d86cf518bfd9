"""The resleeve: stop the CLI's tree and start another CLI (or the same one afresh) in the pane,
one at a time. The move is saved before it is taken, so that a supervisor that crashes half way
leaves a state file from which the next one finishes it, never undoing it half way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

from sidecar.agent.registry import CLIDef
from sidecar.core.event_shapes import Resleeve
from sidecar.core.events import EventBus
from sidecar.process.cli_runner import CliRunner
from sidecar.process.restart import Spawn
from sidecar.process.stats import SupervisorStats


class ResleeveBusy(Exception):
    """A resleeve is already in progress."""


class UnknownCLI(Exception):
    """The requested CLI is not in the registry."""


class Resleeves:
    """`save` writes the state file, which records `move`."""

    def __init__(
        self,
        runner: CliRunner,
        registry: Mapping[str, CLIDef],
        bus: EventBus,
        stats: SupervisorStats,
        *,
        spawn: Spawn,
        save: Callable[[], None],
    ) -> None:
        self.runner = runner
        self.registry = registry
        self.bus = bus
        self.stats = stats
        self._spawn = spawn
        self._save = save
        self.busy = False
        self.move: tuple[str, str] | None = None  # (from, to) while one is under way

    def begin(self, cli_name: str | None, *, refused: str | None) -> tuple[str, asyncio.Task[None]]:
        """Validate and start a resleeve; raises UnknownCLI or ResleeveBusy synchronously so the
        caller can answer 400/409 before anything happens. `refused`: why the supervisor takes
        none now (None: it does)."""
        name = cli_name or self.runner.name
        if name not in self.registry:
            msg = f"unknown CLI {name!r}; known: {', '.join(sorted(self.registry))}"
            raise UnknownCLI(msg)
        if self.busy or refused is not None:
            raise ResleeveBusy(refused or "a resleeve is already in progress")
        self.busy = True
        return name, self._spawn(self._run(name), "resleeve")

    async def _run(self, name: str) -> None:
        began = time.monotonic()
        try:
            async with self.runner.lock:
                previous = self.runner.name
                self.bus.publish(Resleeve(phase="started", previous=previous, cli=name))
                await self._steps(previous, name, stop_first=True)
                self.stats.resleeved(time.monotonic() - began)
        finally:
            self.busy = False

    async def finish(self, previous: str, name: str, *, stop_first: bool) -> None:
        """Finish the resleeve `previous` -> `name` a dead supervisor began (caller holds the
        runner's lock): the old CLI's stop is done again (and the new one started) unless it
        was over."""
        self.busy = True
        try:
            await self._steps(previous, name, stop_first=stop_first)
        finally:
            self.busy = False

    async def _steps(self, previous: str, name: str, *, stop_first: bool) -> None:
        """Stop the CLI's tree, start `name` (caller holds the runner's lock)."""
        self.move = (previous, name)
        self._save()
        if stop_first:
            await self.runner.switch(name)
        self.move = None
        self._save()
        status = self.runner.status
        self.bus.publish(
            Resleeve(phase="done", previous=previous, cli=name, pid=status.pid, state=status.state)
        )
