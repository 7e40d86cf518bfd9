"""The restart policy: whether the CLI is started again when it ends (SIDECAR_RESTART), and the
one start in backoff that may be pending. How long a backoff waits is the rule every supervised
process shares (`sidecar.core.states.next_backoff`), counted in the move into BACKOFF.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from sidecar.config import RestartPolicy

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


def restarts(policy: RestartPolicy, code: int | None) -> bool:
    """Whether a CLI that ended by itself with `code` (None: unknown) is started again."""
    return policy is RestartPolicy.ALWAYS or (policy is RestartPolicy.ON_FAILURE and code != 0)


class PendingStart:
    """The start a backoff waits for, run by `spawn` (a task whose failure crashes the
    supervisor). One at a time: scheduling another, or any launch, cancels it."""

    def __init__(self, spawn: Spawn) -> None:
        self._spawn = spawn
        self._task: asyncio.Task[None] | None = None

    def schedule(self, delay: float, start: Callable[[], Awaitable[None]]) -> None:
        """`start()` after `delay` seconds."""
        self.cancel()
        self._task = self._spawn(self._after(delay, start), "backoff")

    @staticmethod
    async def _after(delay: float, start: Callable[[], Awaitable[None]]) -> None:
        await asyncio.sleep(delay)
        await start()

    def cancel(self) -> None:
        # Not the task that runs this: a launch made by the pending start itself.
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None
