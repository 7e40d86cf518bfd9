"""PID-1 duties in tini's model: a tiny init process reaps every orphan and forwards signals to
the real work (the asyncio supervisor), which runs as its only direct child.

Why split: a blanket `waitpid(-1)` in the supervisor would steal exit statuses from asyncio's
child watcher and from `subprocess` (libtmux runs tmux through it). Here the reaper lives in a
process that starts nothing but the supervisor, so the supervisor's own waits stay exact.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

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


def _log(level: str, message: str, **fields: object) -> None:
    # The init process stays small: no logging framework, one JSON object per line.
    record = {"time": time.time(), "level": level, "logger": "sidecar.init", "msg": message}
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


def run_as_init(work: Callable[[], int]) -> int:
    """Fork `work` into a child, reap everything until it exits, return its exit code."""
    if os.getpid() != 1 and not set_child_subreaper():
        _log("warning", "could not become a child subreaper; orphans go to the real init")
    watched = set(FORWARDED) | {signal.SIGCHLD}
    # Block first, then fork: a signal arriving in between stays pending for sigwaitinfo
    # instead of killing us through its default action (as PID 1 there is none at all).
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    # Objects inherited across fork stay out of the child's collections, so its collector does
    # not write to (and unshare) every page it inherited from init.
    gc.freeze()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            # The mask is inherited across exec; the supervisor and its children need the
            # default one back.
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            # Own process group: a terminal's Ctrl-C reaches init, which forwards it once,
            # instead of hitting the supervisor and ttyd directly as well.
            os.setpgid(0, 0)
            code = work()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # last resort in a forked child: report it, exit 1
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    child_code: int | None = None
    while child_code is None:
        info = signal.sigwaitinfo(watched)
        if info.si_signo != signal.SIGCHLD:
            try:
                os.kill(child, info.si_signo)
            except ProcessLookupError:
                _log(
                    "warning", "signal not forwarded: supervisor already gone", signal=info.si_signo
                )
        # SIGCHLDs coalesce, so reap until there is nothing left to reap.
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == child:
                child_code = exit_code_from_status(status)
    return child_code
