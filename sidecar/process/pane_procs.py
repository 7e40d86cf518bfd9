"""What the CLI's pane runs, found out after the fact: the CLI's pid under the pane's waiter, and
the exit code of a CLI that ended (which its waiter wrote, or tmux saw).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import psutil

from sidecar.pane.tmux import Tmux, TmuxError

PID_WITHIN = 10.0  # seconds the waiter gets to start the CLI: it reads a line of env per fork
STATUS_WITHIN = 0.5  # seconds tmux gets to record the status of a pane whose waiter was killed


async def cli_pid(waiter: int) -> int | None:
    """The CLI's pid: the pane waiter's child that runs another program (the waiter forks
    short-lived copies of itself while it reads the CLI's environment: one that has exited and
    is not reaped yet shows no command line at all, and is not it; None if gone).

    The waiter's own command line is read after its children: a process in the middle of its
    exec shows none, and one that has children is past it."""
    deadline = time.monotonic() + PID_WITHIN
    while True:
        try:
            parent = psutil.Process(waiter)
            children = parent.children()
            own = parent.cmdline()  # after the children: see above
        except psutil.NoSuchProcess:
            return None
        for child in children if own else ():
            with contextlib.suppress(psutil.Error):
                command = child.cmdline()
                if command and command != own:
                    return child.pid
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(0.005)


async def exit_code(tmux: Tmux) -> int | None:
    """The CLI's exit code: its waiter wrote it before exiting. If the waiter itself was
    killed, ask tmux (briefly: it records a status only when it has reaped the pane)."""
    code = tmux.exit_status()
    if code is not None:
        return code
    deadline = time.monotonic() + STATUS_WITHIN
    while True:
        try:
            info = await asyncio.to_thread(tmux.pane_info)
        except (TmuxError, OSError):
            return None  # tmux itself is gone; its own watcher heals it
        # tmux marks the pane dead when the pty closes, and records the status when it
        # reaps the child: the two can come in either order.
        if (info.dead and info.dead_status is not None) or time.monotonic() > deadline:
            return info.dead_status
        await asyncio.sleep(0.01)
