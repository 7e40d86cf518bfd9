"""Process exits noticed on the event loop through pidfds: a pidfd names one process for as
long as it is open, so a watch never fires for another process that got the pid later.
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
