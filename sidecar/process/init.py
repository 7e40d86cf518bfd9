"""PID-1 duties in tini's model: a tiny init process reaps every orphan and forwards signals to
the real work (the asyncio supervisor), which runs as its only direct child. It also starts a
supervisor that crashed again (the crash-only part), and gives up after too many crashes. What
it reaps it reports to the supervisor (`REPORT`): how an orphan such as the tmux server ended.

Why split: a blanket `waitpid(-1)` in the supervisor would steal exit statuses from asyncio's
child watcher and from `subprocess` (libtmux runs tmux through it). Here the reaper lives in a
process that starts nothing but the supervisor, so the supervisor's own waits stay exact.
No asyncio here: init stays small, and its only wait is `sigwaitinfo`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import signal
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from sidecar.core.contract import STOP_GRACE
from sidecar.core.proc import parent_death_signal, start_time
from sidecar.process import proctree

PR_SET_CHILD_SUBREAPER = 36
# Everything a container runtime or a terminal may send that the supervisor should see.
FORWARDED = frozenset(
    {
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGWINCH,
        signal.SIGCONT,
    }
)
WATCHED = FORWARDED | {signal.SIGCHLD}
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
# Supervisor exit codes that are not crashes: 0 it shut down as asked, 2 bad configuration.
CLEAN_EXITS = frozenset({0, 2})

# The crash policy. A supervisor that dies (a signal, an uncaught error: any exit but 0 or 2)
# is started again after RESTART_DELAYS[n - 1] seconds, n being the number of crashes within
# the last CRASH_WINDOW seconds; the first is restarted at once (an OOM kill costs nothing but
# the start). The MAX_CRASHES-th crash within CRASH_WINDOW makes init give up: it stops every
# process it reaps for and exits with that crash's code.
CRASH_WINDOW = 60.0
MAX_CRASHES = 5
RESTART_DELAYS = (0.0, 0.5, 1.0, 2.0)
# What init tells the supervisor of each process it reaps (the supervisor itself excepted), on a
# pipe: pid, start time (`sidecar.core.proc.start_time`), wait status. The tmux server is init's
# orphan, so this is how the supervisor learns which signal killed it (`sidecar.process.deaths`).
# One record is one write far below PIPE_BUF: never split.
REPORT = struct.Struct("=idi")


def _log(level: str, message: str, **fields: object) -> None:
    # The init process stays small: no logging framework, one JSON object per line.
    record = {"time": time.time(), "level": level, "logger": "sidecar.process.init", "msg": message}
    record.update(fields)
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def exit_code_from_status(status: int) -> int:
    """Map a wait status to a shell-style exit code: death by signal N becomes 128+N."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def set_child_subreaper() -> bool:
    """Make orphans of our descendants re-parent to us, as they would to a real PID 1."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Incarnation:
    """What init tells the supervisor it starts (in memory: the supervisor is a fork)."""

    restarts: int  # supervisors started before this one: 0 at the first start
    stop: bool  # a stop was asked for (SIGTERM/SIGINT): adopt what runs, then shut down
    started: float  # time.monotonic() when init started: the sidecar's uptime
    sigmask: frozenset[int]  # the signal mask to restore once the loop's handlers are in place
    reaped: int | None = None  # the read end of init's pipe of `REPORT`s

    def release_signals(self) -> None:
        """Unblock the signals init kept blocked: call once the loop's handlers are installed.
        Until then a SIGTERM stays pending instead of killing the supervisor by its default
        action (which init would take for a crash)."""
        signal.pthread_sigmask(signal.SIG_SETMASK, self.sigmask)


# ---- processes init reaps for ----------------------------------------------------------------


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


def stop_descendants(grace: float) -> int:
    """Stop every process init reaps for (the CLI's tree, ttyd, the tmux server, which then ends
    its panes) the way the supervisor stops the CLI's tree (`sidecar.process.proctree`),
    reaping meanwhile. Returns how many there were. Used when init gives up, and before it
    exits with anything still running."""
    me = os.getpid()
    stopped = proctree.stop_all(lambda: proctree.descendants(me), grace, reap=_reap)
    if stopped.killed:
        _log("warning", "SIGKILL to processes that outlived the grace", count=stopped.killed)
    if stopped.stuck:
        _log("error", "processes did not die on SIGKILL", pids=list(stopped.stuck))
    return stopped.found


# ---- the supervisor's life -------------------------------------------------------------------


class _Init:
    def __init__(self, work: Callable[[Incarnation], int], grace: float, mask: set[int]) -> None:
        self.work = work
        self.grace = grace
        self.mask = frozenset(mask)
        self.started = time.monotonic()
        self.child: int | None = None
        self.restarts = 0
        self.crashes: deque[float] = deque()
        self.stop_requested = False
        self.restart_at = 0.0
        self.reports: int | None = None  # the write end of the running supervisor's `REPORT`s
        # Looked up before any fork: the child only calls it.
        self.arm = parent_death_signal(signal.SIGTERM)

    def spawn(self) -> None:
        self._close_reports()
        # Close-on-exec (Python's default): nothing the supervisor starts inherits either end.
        reaped, reports = os.pipe()
        incarnation = Incarnation(
            self.restarts, self.stop_requested, self.started, self.mask, reaped
        )
        parent = os.getpid()
        # Objects inherited across fork stay out of the child's collections, so its collector
        # does not write to (and unshare) every page it inherited from init.
        gc.freeze()
        child = os.fork()
        if child == 0:
            os.close(reports)
            self._child(incarnation, parent)
        os.close(reaped)
        # Never blocks init: a supervisor that does not read loses only the reports.
        os.set_blocking(reports, False)
        self.reports = reports
        self.child = child

    def _close_reports(self) -> None:
        if self.reports is not None:
            os.close(self.reports)
            self.reports = None

    def _report(self, pid: int, started: float | None, status: int) -> None:
        if self.reports is None or started is None:
            return
        # A full pipe (a supervisor busy or hung) or a closed one (it died) drops the report.
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.reports, REPORT.pack(pid, started, status))

    def _child(self, incarnation: Incarnation, parent: int) -> NoReturn:
        code = 1
        try:
            # When init goes away (a local run killed), the supervisor gets SIGTERM and shuts
            # down as on `docker stop`, so that nothing is left behind. Like every forwarded
            # signal it stays blocked until the loop's handlers are installed.
            self.arm(parent)
            # Own process group: a terminal's Ctrl-C reaches init, which forwards it once,
            # instead of hitting the supervisor and ttyd directly as well.
            os.setpgid(0, 0)
            code = self.work(incarnation)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # last resort in a forked child: report it, exit 1 (a crash)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def run(self) -> int:
        self.spawn()
        code: int | None = None
        while code is None:
            if self.child is None:
                left = self.restart_at - time.monotonic()
                info = signal.sigtimedwait(WATCHED, left) if left > 0 else None
                if info is None:  # the restart delay is over
                    self.spawn()
                    continue
            else:
                info = signal.sigwaitinfo(WATCHED)
            if info.si_signo != signal.SIGCHLD:
                self.on_signal(info.si_signo)
            code = self.reap()
        # Normally nothing is left (the supervisor stopped it all); after giving up, or a
        # supervisor that exited 2 after a restart, the CLI and tmux still run.
        left = stop_descendants(self.grace)
        if left:
            _log("info", "stopped the processes left behind", count=left)
        return code

    def on_signal(self, signo: int) -> None:
        if signo in STOP_SIGNALS:
            # Remembered: a supervisor that dies from here on is started again only to shut
            # down (it adopts what runs, then stops it as on SIGTERM).
            self.stop_requested = True
        if self.child is not None:
            try:
                os.kill(self.child, signo)
            except ProcessLookupError:
                _log("warning", "signal not forwarded: supervisor already gone", signal=signo)
        elif signo in STOP_SIGNALS:
            self.restart_at = time.monotonic()
            _log("info", "stop asked for while no supervisor runs: starting one to shut down")

    def reap(self) -> int | None:
        """Reap every child; init's exit code once the supervisor has ended for good."""
        final: int | None = None
        # SIGCHLDs coalesce, so reap until there is nothing left to reap.
        while True:
            try:
                # Found first and reaped second: the start time of a zombie is still readable.
                found = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if found is None:
                break
            started = start_time(found.si_pid)
            pid, status = os.waitpid(found.si_pid, 0)
            if pid == self.child:
                self.child = None
                self._close_reports()
                final = self.on_supervisor_exit(status)
            else:
                self._report(pid, started, status)
        return final

    def on_supervisor_exit(self, status: int) -> int | None:
        code = exit_code_from_status(status)
        signo = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        if signo is None and code in CLEAN_EXITS:
            return code
        now = time.monotonic()
        self.crashes.append(now)
        while self.crashes[0] <= now - CRASH_WINDOW:
            self.crashes.popleft()
        crashes = len(self.crashes)
        cause = {"exit_code": code, "signal": signal.Signals(signo).name if signo else None}
        if crashes >= MAX_CRASHES:
            _log(
                "error",
                f"supervisor crashed, {crashes} times within {CRASH_WINDOW:g} s: giving up, "
                "stopping everything",
                **cause,
                crashes_in_window=crashes,
            )
            return code
        delay = (
            0.0 if self.stop_requested else RESTART_DELAYS[min(crashes, len(RESTART_DELAYS)) - 1]
        )
        self.restart_at = now + delay
        self.restarts += 1
        _log(
            "error",
            f"supervisor crashed: starting it again in {delay:g} s"
            + (" to shut down" if self.stop_requested else ""),
            **cause,
            crashes_in_window=crashes,
            restarts=self.restarts,
        )
        return None


def run_as_init(work: Callable[[Incarnation], int], *, grace: float = STOP_GRACE) -> int:
    """Fork `work` into a child, reap everything, start `work` again when it crashes; return
    its exit code (or the last crash's, 128+N for signal N, when init gives up). `grace` is how
    long processes left at the end get between SIGTERM and SIGKILL."""
    if os.getpid() != 1 and not set_child_subreaper():
        _log("warning", "could not become a child subreaper; orphans go to the real init")
    # Block first, then fork: a signal arriving in between stays pending for sigwaitinfo
    # instead of killing us through its default action (as PID 1 there is none at all).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    return _Init(work, grace, old_mask).run()
