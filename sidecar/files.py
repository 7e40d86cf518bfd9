"""Careful reads and writes of small files, the one place the package replaces a file: in the
workspace (another user's), in the state dir and in `$SLEEVE_HOME` (the launcher's).

A write fills a new file at a random name (O_EXCL: a symlink or FIFO planted there is never
followed) and renames it over the target, so a reader sees the old file or the new one, never a
part. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

MAX_SMALL_FILE = 64 * 1024


def read_regular(path: Path, limit: int = MAX_SMALL_FILE) -> bytes | None:
    """A small regular file's bytes, None for anything else: a symlink is not followed, a FIFO
    or a device never blocks the caller (O_NONBLOCK, then fstat)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def keep_owner(fd: int, like: os.stat_result) -> None:
    """A rewrite's new file gets the old one's mode and, where allowed, its owner."""
    os.fchmod(fd, stat.S_IMODE(like.st_mode))
    if (like.st_uid, like.st_gid) != (os.fstat(fd).st_uid, os.fstat(fd).st_gid):
        # Allowed to root (CAP_CHOWN); as the file's own user it is a no-op or refused.
        with contextlib.suppress(PermissionError):
            os.fchown(fd, like.st_uid, like.st_gid)


@contextlib.contextmanager
def replacing(path: Path, mode: int) -> Iterator[int]:
    """A new file's fd for the caller to fill; renamed over `path` when the block ends, removed
    if it raises. Made at a random name with O_EXCL, so a name planted there (a symlink, a
    FIFO) is replaced, never followed."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            yield fd
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_new(path: Path, data: bytes, mode: int) -> None:
    """Replace `path` with a new file of `mode` holding `data` (see :func:`replacing`)."""
    with replacing(path, mode) as fd:
        os.fchmod(fd, mode)  # the umask must not take bits the reader needs
        write_all(fd, data)
