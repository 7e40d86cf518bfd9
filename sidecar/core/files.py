"""Careful reads and writes of small files, the one place the package replaces a file: in the
workspace (another user's), in the state dir and in `$SLEEVE_HOME` (the launcher's).

A write fills a new file at a random name (O_EXCL: a symlink or FIFO planted there is never
followed) and renames it over the target, so a reader sees the old file or the new one, never a
part; how much of that a machine crash keeps is the caller's `Sync`. Standard library only.
"""

from __future__ import annotations

import contextlib
import enum
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

MAX_SMALL_FILE = 64 * 1024


class Sync(enum.IntEnum):
    """What `replacing` makes durable, for a file that must outlive a machine crash."""

    NONE = 0  # runtime state: a process crash keeps the page cache, a machine crash the processes
    DATA = 1  # the new file's bytes are on disk before the rename
    RENAME = 2  # and the rename too: the directory is fsynced after it


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


class TooBig(ValueError):
    """A file holds more than the caller reads."""


def read_limited(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the file at `path`, at most `limit` of them: TooBig when it holds more,
    OSError when it cannot be read. Never reads past `limit` + 1 (a huge file costs nothing)."""
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        msg = f"larger than {limit} bytes"
        raise TooBig(msg)
    return data


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


def _sync_dir(directory: Path, dir_fd: int | None) -> None:
    # The rename is durable only once the directory entry is. Some filesystems refuse to fsync
    # a directory, and acting as the user may not be allowed to open it for reading: fine.
    with contextlib.suppress(OSError):
        if dir_fd is not None:
            os.fsync(dir_fd)
            return
        fd = os.open(directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def replacing(
    path: Path,
    mode: int,
    *,
    sync: Sync = Sync.NONE,
    dir_fd: int | None = None,
    temp: str | None = None,
) -> Iterator[int]:
    """A new file's fd (created with `mode`, less the umask) for the caller to fill; renamed
    over `path` when the block ends, removed if it raises. Made at a random name with O_EXCL, so
    a name planted there (a symlink, a FIFO) is replaced, never followed. `dir_fd`: `path` is a
    name in that directory (which a symlink swapped in above can then not redirect). `temp`:
    the new file's name, for a caller that sweeps the leftovers of killed writers by name."""
    tmp = path.with_name(temp or f".{path.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            yield fd
            if sync >= Sync.DATA:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if sync >= Sync.RENAME:
        _sync_dir(path.parent, dir_fd)


def fill(fd: int, data: bytes, mode: int) -> None:
    """`data` into `replacing`'s new file, which gets exactly `mode`."""
    os.fchmod(fd, mode)  # the umask must not take bits the reader needs
    write_all(fd, data)


def write_new(path: Path, data: bytes, mode: int, *, sync: Sync = Sync.NONE) -> None:
    """Replace `path` with a new file of `mode` holding `data` (see :func:`replacing`)."""
    with replacing(path, mode, sync=sync) as fd:
        fill(fd, data, mode)
