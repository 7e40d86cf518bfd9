"""One sidecar per state dir: an exclusive kernel lock (flock) on `sidecar.lock`, taken before
anything in the dir is touched and held by init and, through fork, by every supervisor it starts,
until the last of them exits. The kernel lets go of a dead process's locks, SIGKILL included, so
a stale lock cannot outlive its holder. The file says who holds it, for the sidecar refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

from sidecar.config import ConfigError

# A holder whose init is gone is a supervisor stopping what it ran: waited for this long.
DYING_WAIT = 10.0
# A holder that has just taken the lock writes who it is at once: read again for this long.
NAMING_WAIT = 1.0
POLL = 0.05


def take(path: Path, port: int) -> int:
    """Lock `path` for this process (and its forks), or ConfigError naming the holder. The
    descriptor returned is the lock: keep it open for the sidecar's life (close-on-exec, so
    nothing the sidecar executes holds it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        msg = f"SIDECAR_STATE_DIR: cannot open its lock {path}: {exc.strerror}"
        raise ConfigError(msg) from None
    try:
        _lock(fd, path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {port}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock(fd: int, path: Path) -> None:
    if _try(fd):
        return
    holder = _holder(fd)
    if holder is not None and not _alive(holder[0]):
        # Its init has exited; its supervisor is stopping the CLI and tmux: let it finish.
        deadline = time.monotonic() + DYING_WAIT
        while time.monotonic() < deadline:
            if _try(fd):
                return
            time.sleep(POLL)  # sleep-ok: the interval of a bounded wait for a dying holder
    who = f"pid {holder[0]}, port {holder[1]}" if holder else "starting, not yet named"
    msg = (
        f"SIDECAR_STATE_DIR: {path.parent} is in use by another sidecar ({who}); stop that "
        "one first, or give this one a state dir of its own"
    )
    raise ConfigError(msg)


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True


def _holder(fd: int) -> tuple[int, int] | None:
    """The holder's pid and port as its file says (None: not written, or not ours)."""
    deadline = time.monotonic() + NAMING_WAIT
    while True:
        with contextlib.suppress(OSError, ValueError):
            pid, port = (int(word) for word in os.pread(fd, 64, 0).split())
            return pid, port
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL)  # sleep-ok: a lock just taken is named within microseconds


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    return True
