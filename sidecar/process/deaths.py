"""How a process died, told apart: a crash (it faulted: SIGSEGV, SIGABRT, ...), a kill (a signal
sent to it), an exit. The tmux server is init's orphan, not the supervisor's child, so only init
learns its wait status: init reports every status it reaps on a pipe (`sidecar.process.init`),
and `Reaped` reads them for the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import OrderedDict
from typing import NamedTuple

from sidecar.process.init import REPORT

# Signals a program gets from its own fault (their default action dumps core): a crash. Any
# other signal was sent to it: a kill.
CRASH_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGABRT,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)
KEEP = 256  # reports kept, newest first: init reaps every orphan, most are nobody's concern
REPORT_WITHIN = 1.0  # seconds an exit waits for init's report (it comes within milliseconds)


def _signal_name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


class Death(NamedTuple):
    """`signo`: the signal it died of (None: it exited, or it is not known); `code`: its exit
    code when it exited."""

    signo: int | None
    code: int | None

    @classmethod
    def of_status(cls, status: int) -> Death:
        """From a wait status (`os.waitpid`)."""
        if os.WIFSIGNALED(status):
            return cls(os.WTERMSIG(status), None)
        return cls(None, os.waitstatus_to_exitcode(status))

    @classmethod
    def of_returncode(cls, code: int | None) -> Death:
        """From `subprocess`/asyncio's returncode: -N for signal N."""
        if code is not None and code < 0:
            return cls(-code, None)
        return cls(None, code)

    @property
    def kind(self) -> str:
        """`crash`, `kill`, `exit` or `unknown`."""
        if self.signo is not None:
            return "crash" if self.signo in CRASH_SIGNALS else "kill"
        return "unknown" if self.code is None else "exit"

    @property
    def label(self) -> str:
        """The `signal` label of a metric: the signal's name, `none` for an exit, `unknown`."""
        if self.signo is not None:
            return _signal_name(self.signo)
        return "unknown" if self.code is None else "none"

    def describe(self) -> str:
        """`crashed (SIGSEGV)`, `was killed (SIGKILL)`, `exited with 1`, or that it is not
        known."""
        kind = self.kind
        if kind == "crash":
            return f"crashed ({self.label})"
        if kind == "kill":
            return f"was killed ({self.label})"
        if kind == "exit":
            return f"exited with {self.code}"
        return "died (how is not known)"


UNKNOWN = Death(None, None)


def of_shell_code(code: int | None) -> str:
    """What a shell's exit code of 128+N says: `" (128+9: SIGKILL, a kill)"`, else `""`. The
    pane's waiter reports the CLI's status as its shell does, so 137 may also be an exit(137)."""
    if code is None or not 128 < code < 128 + signal.NSIG:
        return ""
    death = Death(code - 128, None)
    return f" (128+{death.signo}: {death.label}, a {death.kind})"


class Reaped:
    """The wait statuses init reported, by process (pid and start time, so that a reused pid is
    another process), the newest `KEEP` of them."""

    def __init__(self) -> None:
        self._statuses: OrderedDict[tuple[int, float], int] = OrderedDict()
        self._fd: int | None = None
        self._partial = b""
        self._arrived: asyncio.Event | None = None  # made by `listen`, on the loop that reads

    @property
    def listening(self) -> bool:
        return self._fd is not None

    def listen(self, fd: int) -> None:
        """Read init's reports from `fd` (the read end of its pipe) on the running loop."""
        os.set_blocking(fd, False)
        self._arrived = asyncio.Event()
        asyncio.get_running_loop().add_reader(fd, self._read)
        self._fd = fd

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
        self._wake()

    def _read(self) -> None:
        assert self._fd is not None
        try:
            data = os.read(self._fd, REPORT.size * 64)
        except BlockingIOError:
            return
        if not data:  # init is gone
            self.close()
            return
        data = self._partial + data
        whole = len(data) - len(data) % REPORT.size
        for pid, start, status in REPORT.iter_unpack(data[:whole]):
            self._statuses[pid, start] = status
            self._statuses.move_to_end((pid, start))
        self._partial = data[whole:]
        while len(self._statuses) > KEEP:
            self._statuses.popitem(last=False)
        self._wake()

    def _wake(self) -> None:
        """Every waiter looks again (each report may be the one it waits for)."""
        if self._arrived is not None:
            self._arrived.set()
            self._arrived = asyncio.Event()

    async def death_of(self, pid: int, start: float | None, within: float = REPORT_WITHIN) -> Death:
        """How the process `pid` started at `start` died (it has exited: its pidfd said so), as
        soon as init's report is in; UNKNOWN after `within` seconds, or at once when init sends
        no reports (a supervisor not started by `sidecar run`). `start` None: the newest report
        for `pid`."""
        deadline = time.monotonic() + within
        while True:
            status = self._find(pid, start)
            if status is not None:
                return Death.of_status(status)
            left = deadline - time.monotonic()
            if self._arrived is None or not self.listening or left <= 0:
                return UNKNOWN
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def _find(self, pid: int, start: float | None) -> int | None:
        if start is not None:
            return self._statuses.get((pid, start))
        for (reaped, _), status in reversed(self._statuses.items()):
            if reaped == pid:
                return status
        return None


# One per supervisor process: init's pipe is the process's, like its signal handlers.
# `sidecar.main` starts it listening; the heal path asks it.
REAPED = Reaped()
