"""Small filesystem helpers shared by the launcher: private dirs, flock, atomic writes.

Everything under `$SLEEVE_HOME` is private to the user (dirs 0700, files 0600), and every
write is temp file + fsync + rename (`sidecar.core.files`) so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from sidecar.core import files

DIR_MODE = 0o700
FILE_MODE = 0o600

logger = logging.getLogger(__name__)


class LauncherError(Exception):
    """A problem the user can act on; the CLI prints the message and exits 1."""


def private_dir(path: Path) -> Path:
    """Create `path` and any missing parents, each 0700; an unwritable location is a LauncherError.

    (`Path.mkdir(parents=True)` would give the parents the umask's mode, `projects/` say.)
    """
    try:
        _make_private(path)
    except OSError as exc:
        msg = f"cannot create {path}: {exc.strerror or exc}"
        raise LauncherError(msg) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        msg = f"{path} is not writable"
        raise LauncherError(msg)
    return path


def _make_private(path: Path) -> None:
    if path.is_dir():
        return
    try:
        os.mkdir(path, DIR_MODE)
    except FileNotFoundError:
        if path.parent == path:
            raise
        _make_private(path.parent)
        _make_private(path)
        return
    except FileExistsError:
        if path.is_dir():  # made by someone else meanwhile
            return
        raise
    os.chmod(path, DIR_MODE)  # a umask may take bits even from 0700


def private_home(home: Path) -> Path:
    """`private_dir(home)`, and a pre-existing `$SLEEVE_HOME` of ours tightened to 0700."""
    private_dir(home)
    st = home.stat()
    if st.st_uid == os.geteuid() and st.st_mode & 0o777 != DIR_MODE:
        try:
            os.chmod(home, DIR_MODE)
        except OSError as exc:
            logger.warning("cannot make %s private (0700): %s", home, exc.strerror or exc)
        else:
            logger.info("made %s private (0700; it was %o)", home, st.st_mode & 0o777)
    return home


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
    """Write `data` to `path` (0600) via a temp file in the same dir, fsync, then rename."""
    raw = data.encode() if isinstance(data, str) else data
    with contextlib.ExitStack() as stack:
        try:
            fd = stack.enter_context(files.replacing(path, FILE_MODE, sync=files.Sync.DATA))
        except OSError as exc:
            msg = f"cannot write {path}: {exc.strerror or exc}"
            raise LauncherError(msg) from exc
        files.fill(fd, raw, FILE_MODE)


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
