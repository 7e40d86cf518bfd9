"""Stopping a process tree, the one way init and the supervisor both do it: SIGTERM, SIGHUP and
SIGCONT to every process at once, a wait on pidfds for the grace, then the tree is read again
and what is left is stopped (SIGSTOP), again until nothing new turns up, and all of it gets
SIGKILL.

Which processes: `descendants` (init: everything it reaps for) or `collect_tree` (the CLI's
tree with its session's stragglers). A signal goes only through a pidfd opened while the pid
was still the process seen (its start time: `sidecar.core.proc`), never to a reused pid.
Standard library only, and blocking: init (no asyncio) calls it as it is, the supervisor from a
worker thread.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

from sidecar.core.proc import start_time, stat

# After SIGKILL the kernel frees a process at once; waiting longer than this means it is stuck
# in an uninterruptible sleep (a hung NFS mount), and shutdown must go on anyway.
KILL_WAIT = 5.0

Procs = dict[int, float]  # pid -> start time: the processes seen


class Stopped(NamedTuple):
    found: int  # processes there at the first look
    killed: int  # SIGKILLed after the grace (with what they forked meanwhile)
    stuck: tuple[int, ...]  # still there KILL_WAIT after their SIGKILL


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _children(pid: int) -> list[int]:
    """`pid`'s children as the kernel lists them (per thread); none once it is gone."""
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += map(int, fh.read().split())
    return kids


def _children_listed() -> bool:
    """Whether the kernel lists children (CONFIG_PROC_CHILDREN): else the tree is found by
    reading every process's parent, which costs a file read per process."""
    me = os.getpid()
    return os.path.exists(f"/proc/{me}/task/{me}/children")


def _under(root: int) -> set[int]:
    """Every process below `root`."""
    if _children_listed():
        found: set[int] = set()
        todo = [root]
        while todo:
            for child in _children(todo.pop()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
        return found
    parents = {pid: entry.ppid for pid in _pids() if (entry := stat(pid)) is not None}
    found = set()
    todo = [root]
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def _running(pids: Iterable[int]) -> Procs:
    """`pids` that still run (a zombie needs no signal), with their start times."""
    return {pid: entry.start for pid in pids if (entry := stat(pid)) and not entry.zombie}


def descendants(root: int) -> Procs:
    """Every running process under `root`. As PID 1 or a subreaper, init is the ancestor of
    everything the sidecar started: orphans re-parent to it."""
    return _running(_under(root))


def collect_tree(root: int, root_started: float | None) -> Procs:
    """The running processes of the tree under `root`, plus anything still in its session (a
    background job orphaned earlier has left the tree but not the session).

    `root` is only taken for itself when its start time is still `root_started`: a process that
    died long ago may have left its pid to an unrelated one. Session members need no such check,
    as the kernel never hands out a pid that is still some process's session id; but when
    `root`'s pid is in use by another process, the old session is gone for sure (a recorded
    pid from a crashed supervisor), and that process's own session is none of ours.
    """
    started = start_time(root)
    found: set[int] = set()
    if started is not None and root_started is not None:
        if started != root_started:
            return {}
        found = {root, *_under(root)}
    me = os.getpid()
    for pid in _pids():
        with contextlib.suppress(OSError):
            if pid != me and os.getsid(pid) == root:
                found.add(pid)
    return _running(found)


def _nothing() -> None:
    pass


def _open(procs: Procs, fds: dict[int, int]) -> dict[int, int]:
    """Pidfds for the processes of `procs` still the ones seen (same start time), added to
    `fds`; the new ones."""
    new: dict[int, int] = {}
    for pid, started in procs.items():
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        if start_time(pid) != started:
            os.close(fd)
            continue
        if pid in fds:  # a process seen before has exited, and its pid is another's now
            os.close(fds[pid])
        new[pid] = fds[pid] = fd
    return new


def _signal(fds: Iterable[int], *sigs: int) -> None:
    for fd in fds:
        for sig in sigs:
            # Gone meanwhile, or not ours to signal (another user's, in a test): nothing to do.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(fd, sig)


def _wait_gone(fds: dict[int, int], timeout: float, reap: Callable[[], None]) -> set[int]:
    """Wait until every process of `fds` (pid -> pidfd) has exited (its pidfd turns readable)
    or `timeout` passes, calling `reap` meanwhile; the pids still running."""
    deadline = time.monotonic() + timeout
    poller = select.poll()
    by_fd = {fd: pid for pid, fd in fds.items()}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    alive = set(by_fd)
    while alive:
        reap()
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _ in poller.poll(left * 1000):
            poller.unregister(fd)
            alive.discard(fd)
    reap()
    return {by_fd[fd] for fd in alive}


def _freeze(collect: Callable[[], Procs], left: dict[int, int], fds: dict[int, int]) -> None:
    """SIGSTOP to `left`, and to whatever `collect` finds that is new, again until nothing new
    turns up: a stopped process cannot fork, so nothing forked since the first look (during the
    grace, or while this runs) is left out of the SIGKILL. `left` grows by what is found (`fds`
    keeps every pidfd opened)."""
    _signal(left.values(), signal.SIGSTOP)
    while new := _open({p: s for p, s in collect().items() if p not in left}, fds):
        _signal(new.values(), signal.SIGSTOP)
        left.update(new)


def stop_all(
    collect: Callable[[], Procs], grace: float, reap: Callable[[], None] = _nothing
) -> Stopped:
    """Stop what `collect` finds: SIGTERM, SIGHUP (an interactive shell ignores SIGTERM, and
    a closing terminal sends SIGHUP) and SIGCONT (a stopped process cannot act on either) to all
    at once, and SIGKILL to whatever is left after `grace`, with what it forked meanwhile.
    `reap` runs while waiting (init reaps its children)."""
    fds: dict[int, int] = {}
    try:
        found = _open(collect(), fds)
        _signal(found.values(), signal.SIGTERM, signal.SIGHUP, signal.SIGCONT)
        left = {pid: fds[pid] for pid in _wait_gone(found, grace, reap)}
        _freeze(collect, left, fds)
        if not left:
            return Stopped(len(found), 0, ())
        _signal(left.values(), signal.SIGKILL)
        stuck = _wait_gone(left, KILL_WAIT, reap)
        return Stopped(len(found), len(left), tuple(sorted(stuck)))
    finally:
        for fd in fds.values():
            os.close(fd)


def stop_tree(root: int, root_started: float | None, grace: float) -> Stopped:
    """`stop_all` for the tree and session of `root` (`collect_tree`)."""
    return stop_all(lambda: collect_tree(root, root_started), grace)
