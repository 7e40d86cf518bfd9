"""Small filesystem helpers shared by the launcher: private dirs, flock, atomic writes.

Everything under `$SLEEVE_HOME` is private to the user (dirs 0700, files 0600), and every
write is temp file + fsync + rename so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


class LauncherError(Exception):
    """A problem the user can act on; the CLI prints the message and exits 1."""


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700; an unwritable location is a LauncherError."""
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot create {path}: {exc.strerror or exc}"
        raise LauncherError(msg) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        msg = f"{path} is not writable"
        raise LauncherError(msg)
    return path


@contextlib.contextmanager
def locked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an flock on `path` (a directory or a lock file) for the duration of the block.

    flock on a directory fd works on Linux and needs no extra lock file, which is why the
    project directory itself is the lock for slot creation and removal.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC
    if not path.is_dir():
        flags |= os.O_CREAT
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        msg = f"cannot lock {path}: {exc.strerror or exc}"
        raise LauncherError(msg) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the fd releases the lock


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `data` to `path` via a 0600 temp file in the same dir, fsync, then rename."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or exc}"
        raise LauncherError(msg) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def touch_private(path: Path, initial: str | bytes = b"") -> None:
    """Create `path` with `initial` content (mode 0600) unless it already exists."""
    if path.exists():
        return
    raw = initial.encode() if isinstance(initial, str) else initial
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        return  # someone else created it first; theirs is as good as ours
    except OSError as exc:
        msg = f"cannot create {path}: {exc.strerror or exc}"
        raise LauncherError(msg) from exc
    with os.fdopen(fd, "wb") as fh:
        fh.write(raw)
