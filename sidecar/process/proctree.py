"""Stopping a process tree: collect it (with its session's stragglers), signal it, wait on pidfds.

Used by the supervisor for the CLI's tree (resleeve, shutdown, heal). Process identity across
pid reuse comes from `sidecar.core.proc.start_time`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import psutil

from sidecar.core.proc import start_time

log = logging.getLogger(__name__)

# After SIGKILL the kernel frees a process at once; waiting longer than this means it is stuck
# in an uninterruptible sleep (a hung NFS mount), and shutdown must go on anyway.
KILL_WAIT = 5.0


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


def collect_tree(root: int, root_started: float | None) -> list[psutil.Process]:
    """The process tree under `root`, plus anything still in its session (a background job
    orphaned earlier has left the tree but not the session).

    `root` is only taken for itself when its start time is still `root_started`: a process that
    died long ago may have left its pid to an unrelated one. Session members need no such check,
    as the kernel never hands out a pid that is still some process's session id; but when
    `root`'s pid is in use by another process, the old session is gone for sure (a recorded
    pid from a crashed supervisor), and that process's own session is none of ours.
    """
    procs: dict[int, psutil.Process] = {}
    started = start_time(root)
    try:
        top = psutil.Process(root)
        if root_started is not None and started == root_started:
            procs[root] = top
            for child in top.children(recursive=True):
                procs[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    if started is not None and root_started is not None and started != root_started:
        return list(procs.values())
    for pid in psutil.pids():
        if pid in procs or pid == os.getpid():
            continue
        try:
            if os.getsid(pid) == root:
                procs[pid] = psutil.Process(pid)
        except (OSError, psutil.Error):
            continue
    return list(procs.values())


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        # psutil checks the create time first, so a recycled pid is never signalled.
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


def freeze_tree(
    root: int, root_started: float | None, known: list[psutil.Process]
) -> list[psutil.Process]:
    """`known` and whatever the tree and session of `root` hold now, every one stopped
    (SIGSTOP), collected again until no new process turns up: a stopped process cannot fork,
    so nothing forked since the first look is left out of a SIGKILL."""
    procs = {p.pid: p for p in known}
    signal_all(known, signal.SIGSTOP)
    while new := [
        p for p in collect_tree(root, root_started) if p.pid not in procs and _running(p)
    ]:
        signal_all(new, signal.SIGSTOP)
        procs.update((p.pid, p) for p in new)
    return list(procs.values())


async def stop_tree(root: int, root_started: float | None, grace: float) -> None:
    """SIGTERM (and SIGHUP) to the whole tree of `root`, SIGKILL what is left after `grace`,
    with what it forked meanwhile."""
    procs = await asyncio.to_thread(collect_tree, root, root_started)
    if not procs:
        return
    signal_all(procs, signal.SIGTERM)
    # SIGHUP as a closing terminal would send it: an interactive shell ignores SIGTERM.
    signal_all(procs, signal.SIGHUP)
    signal_all(procs, signal.SIGCONT)  # a stopped process cannot act on either
    alive = await wait_exited([p.pid for p in procs], grace)
    if alive:
        left = [p for p in procs if p.pid in alive]
        left = await asyncio.to_thread(freeze_tree, root, root_started, left)
        log.warning("SIGKILL to %d processes that outlived %.1fs", len(left), grace)
        signal_all(left, signal.SIGKILL)
        await wait_exited([p.pid for p in left], KILL_WAIT)


def _running(proc: psutil.Process) -> bool:
    """Not yet exited: a zombie (dead, its parent yet to reap it) needs no signal."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
