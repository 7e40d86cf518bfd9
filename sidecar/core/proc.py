"""What /proc says about a process, read in one place: its identity across pid reuse and wall-clock
steps (used by init, the supervisor and the launcher alike), its parent, its argv; and dying
with a parent. Standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable
from typing import NamedTuple


class Stat(NamedTuple):
    """The fields of /proc/PID/stat the package uses."""

    ppid: int
    start: float  # when the process started, in seconds after boot (see `start_time`)
    session: int  # its session's id (the pid of the session's leader)
    zombie: bool  # exited, its parent yet to reap it: nothing to signal or wait for


def stat(pid: int) -> Stat | None:
    """`pid`'s state, parent, session and start time from /proc/PID/stat (fields 3, 4, 6 and
    22); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # Field 2 (the command name, in parentheses) may hold spaces and ')': split after the last.
    fields = raw[raw.rindex(b")") + 2 :].split()
    start = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return Stat(int(fields[1]), start, int(fields[3]), fields[0] == b"Z")


def start_time(pid: int) -> float | None:
    """When `pid` started, in seconds after boot; None if it is gone.

    A pid and this value name one process: a reused pid starts later. Not psutil's create_time,
    which adds the boot time as the wall clock gives it now, so that a step of the clock (NTP at
    boot, a resumed VM) would make a live process look like another one.
    """
    found = stat(pid)
    return None if found is None else found.start


def ppid(pid: int) -> int | None:
    """`pid`'s parent; None if it is gone."""
    found = stat(pid)
    return None if found is None else found.ppid


def cmdline(pid: int) -> list[bytes] | None:
    """The argv `pid` runs now, as bytes; None if it is gone (or unreadable)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return raw.split(b"\0")[:-1]


def send_signal(pid: int, start: float, sig: int) -> bool:
    """Send `sig` to the process that is `pid` started at `start`, and to no other: a pidfd
    pins a process first, then its start time says whether it is still the one meant (a reused
    pid starts later). Whether the signal was sent."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    try:
        if start_time(pid) != start:
            return False
        signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
    return True


PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int) -> Callable[[int], None]:
    """A function for a freshly forked child: `arm(parent)` has the kernel send `sig` to the
    child when `parent` (the thread that forked it) dies.

    libc is looked up here, in the parent: a lookup after fork could block on a loader lock
    some other thread of the parent held at the time. `arm` also closes the race with a parent
    that died before the call (no signal would ever come): it then sends `sig` at once (it
    stays pending while blocked). The kernel clears the setting on a change of credentials
    (setuid) and children do not inherit it, so `arm` must run after any setuid, in the very
    process that is to die.
    """
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm(parent: int) -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm
