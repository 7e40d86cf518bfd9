"""Process exits noticed on the event loop through pidfds: a pidfd names one process for as
long as it is open, so a watch (or a wait) never fires for another process that got the pid
later.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable


class PidWatches:
    """`watch(key, pid, callback)`: `callback()` runs on the loop when `pid` exits (its pidfd
    turns readable). One watch per key; a new watch under a key replaces the old one."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}

    def watch(self, key: str, pid: int, callback: Callable[[], object]) -> None:
        loop = asyncio.get_running_loop()
        self.unwatch(key)
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(callback)
            return
        self._fds[key] = fd

        def fire() -> None:
            self.unwatch(key)
            callback()

        loop.add_reader(fd, fire)

    def unwatch(self, key: str) -> None:
        fd = self._fds.pop(key, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_exited(pids: list[int], timeout: float) -> set[int]:
    """Wait (on pidfds, no polling) until every pid has exited; return those still alive."""
    loop = asyncio.get_running_loop()
    waiters: dict[int, asyncio.Future[None]] = {}
    fds: list[int] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # already gone and reaped
        fds.append(fd)
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, fut)
        waiters[pid] = fut
    try:
        if waiters:
            await asyncio.wait(waiters.values(), timeout=timeout)
        return {pid for pid, fut in waiters.items() if not fut.done()}
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)
