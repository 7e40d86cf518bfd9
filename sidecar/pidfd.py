"""Process exits noticed on the event loop, and signals that reach only the process meant.

Both go through pidfds: a pidfd names one process for as long as it is open, so neither a
watch nor a signal can land on another process that got the pid after the first one died.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

from sidecar.persist import ProcRef
from sidecar.proc import start_time


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


def send_signal(ref: ProcRef, sig: int) -> bool:
    """Send `sig` to the process `ref` names and to no other: the pidfd pins a process first,
    then its start time says whether it is still the one recorded (a reused pid starts later).
    Whether the signal was sent."""
    try:
        fd = os.pidfd_open(ref.pid)
    except ProcessLookupError:
        return False
    try:
        if start_time(ref.pid) != ref.start:
            return False
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
    return True
