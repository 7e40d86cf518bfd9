"""`.cstack/CURRENT.md` on disk: a bounded read that never raises, and writers that change only
the Status / Task sections, keep every other byte, the owner and the mode, and replace the file
atomically (temp file in the same directory + fsync + os.replace). The text is
`sidecar.workspace.cstack`'s.

The file is the agent's: it may be a symlink (followed only while it stays inside the
workspace), a FIFO or a device (never opened for more than a non-blocking look). Given an
`acting.Owner`, every access is made as the CLI's user, and what is created belongs to it.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from sidecar.core import files
from sidecar.security.acting import Owner, acting, claim
from sidecar.workspace.cstack import (
    CurrentState,
    check_writable,
    edit_sections,
    goal_lines,
    parse_current,
)

__all__ = ["MAX_CURRENT_BYTES", "SEED_TEMPLATE", "read_current", "write_goal", "write_status"]


# An agent's notes file is a few KiB; anything bigger is a runaway writer. Reading stays bounded
# so /status can never be made slow or memory-hungry by the file.
MAX_CURRENT_BYTES = 1024 * 1024

SEED_TEMPLATE = """\
# Current State

## Status
{status}

## Task
{task}

## Progress

## Blockers
(none)

## Next Steps
"""

# ---------------------------------------------------------------------------------------------
# Reading


def _read_bounded(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, min(65536, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


class OutsideWorkspace(OSError):
    """CURRENT.md (a symlink) leads out of the workspace."""


def inside(path: Path, workspace: Path | None) -> Path:
    """`path` with its symlinks resolved; OutsideWorkspace when that leaves `workspace`."""
    real = path.resolve()
    if workspace is not None and not real.is_relative_to(workspace.resolve()):
        msg = f"{path} leads to {real}, outside the workspace; not followed"
        raise OutsideWorkspace(errno.EXDEV, msg)
    return real


def _open_regular(path: Path, workspace: Path | None, flags: int) -> int:
    """An fd of the regular file `path` (inside the workspace); never follows a symlink out of
    it, never blocks on a FIFO or a device (O_NONBLOCK, then fstat)."""
    real = inside(path, workspace)
    # Looked at before it is opened (opening a device can act), and again after (it may have
    # been swapped in between).
    _check_regular(path, os.lstat(real))
    fd = os.open(real, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _check_regular(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_regular(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        msg = f"{path} is {kind}"
        raise OSError(errno.EINVAL, msg)


def read_current(
    path: Path, workspace: Path | None = None, owner: Owner | None = None
) -> CurrentState:
    """Read and parse CURRENT.md; never raises. Problems become warnings (and status `unknown`).
    `workspace`: symlinks are followed only inside it; `owner`: read as the CLI's user."""
    warnings: list[str] = []

    def unknown(msg: str) -> CurrentState:
        return CurrentState("unknown", None, 0, 0, (), (), (*warnings, msg))

    try:
        with acting(owner):
            fd = _open_regular(path, workspace, os.O_RDONLY)
    except FileNotFoundError:
        return unknown(f"{path} not found")
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EINVAL) and exc.strerror:
            return unknown(exc.strerror)  # our own message: outside, or not a regular file
        return unknown(f"cannot read {path}: {exc.strerror or exc}")
    try:
        data = _read_bounded(fd, MAX_CURRENT_BYTES + 1)
    except OSError as exc:
        return unknown(f"cannot read {path}: {exc.strerror or exc}")
    finally:
        os.close(fd)

    truncated = len(data) > MAX_CURRENT_BYTES
    if truncated:
        data = data[:MAX_CURRENT_BYTES]
        warnings.append(f"{path} is larger than {MAX_CURRENT_BYTES} bytes; read only the start")
    if not data:
        return unknown(f"{path} is empty")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        # Some Windows editors save "Unicode" as UTF-16; it is text, not binary.
        text = data.decode("utf-16", errors="replace")
        warnings.append(f"{path} is UTF-16; UTF-8 is expected")
    elif b"\x00" in data:
        return unknown(f"{path} looks binary (contains NUL bytes); ignored")
    else:
        # final=False when truncated: a multi-byte character cut at the limit is dropped quietly
        # instead of being reported as invalid UTF-8.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="strict")
        try:
            text = decoder.decode(data, final=not truncated)
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", errors="replace")
            warnings.append(f"{path} is not valid UTF-8 (byte {exc.start}); decoded with U+FFFD")
    state = parse_current(text)
    return dataclasses.replace(state, warnings=(*warnings, *state.warnings))


# ---------------------------------------------------------------------------------------------
# Writing


def _identity(st: os.stat_result | None) -> tuple[int, int, int, int] | None:
    return None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _atomic_write(
    target: Path, data: bytes, like: os.stat_result | None, owner: Owner | None
) -> None:
    with files.replacing(target, 0o666, sync=files.Sync.RENAME) as fd:
        if like is not None:
            # A rewrite keeps the file's mode and owner (the CLI's user's, say).
            files.keep_owner(fd, like)
        else:
            claim(owner, fd)
        files.write_all(fd, data)


def _read_existing(path: Path, workspace: Path | None) -> tuple[bytes, os.stat_result] | None:
    """The file's bytes and stat (None when missing), through `_open_regular`'s checks."""
    try:
        fd = _open_regular(path, workspace, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        return _read_bounded(fd, st.st_size + 1), st
    finally:
        os.close(fd)


def _rewrite(
    path: Path,
    edit: Callable[[str | None], str],
    *,
    create: bool,
    workspace: Path | None = None,
    owner: Owner | None = None,
) -> bool:
    """Read-modify-write with an optimistic check against a concurrent writer (the agent).

    The agent edits CURRENT.md with no lock we could share, so the file's identity (inode, size,
    mtime) is compared just before the rename; if it changed, the edit is redone on the new text.
    """
    with acting(owner):
        # Replacing a symlink would cut it; write through to the file it points at instead
        # (only inside the workspace).
        target = inside(path, workspace) if path.is_symlink() else path
        attempts = 3
        for attempt in range(1, attempts + 1):
            found = _read_existing(target, workspace)
            if found is None and not create:
                return False
            raw = None if found is None else found[0]
            before = None if found is None else found[1]
            # surrogateescape: bytes that are not UTF-8 are carried through unchanged.
            old = None if raw is None else raw.decode("utf-8", errors="surrogateescape")
            data = edit(old).encode("utf-8", errors="surrogateescape")
            if raw is None:
                _make_dirs(target.parent, owner)
            now = _stat_or_none(target)
            unchanged = _identity(before) == _identity(now)
            if unchanged or attempt == attempts:  # last try: our edit wins over a busy writer
                _atomic_write(target, data, now, owner)
                break
    return True


def _make_dirs(directory: Path, owner: Owner | None) -> None:
    """mkdir -p, each new directory the owner's."""
    missing = []
    for part in [directory, *directory.parents]:
        if part.exists():
            break
        missing.append(part)
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(part)
            if owner is not None and not owner.act_as:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    claim(owner, fd)
                finally:
                    os.close(fd)


def _stat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def write_goal(
    path: Path, goal: str, workspace: Path | None = None, owner: Owner | None = None
) -> None:
    """Set Task = goal and Status = working, creating the file (and its directory) if missing.

    Every other section of an existing file is kept byte for byte. The goal is stored verbatim
    except: CRLF becomes LF, surrounding whitespace is stripped, and a line that would read as a
    `##` heading gets a leading backslash (removed again by parse_current). Raises OSError when
    the file cannot be written (read-only workspace) and ValueError for a goal with NUL.
    """
    task = goal_lines(goal)

    def edit(old: str | None) -> str:
        if old is None or not old.removeprefix("\ufeff").strip():
            return SEED_TEMPLATE.format(status="working", task="\n".join(task))
        return edit_sections(old, {"status": ["working"], "task": task})

    _rewrite(path, edit, create=True, workspace=workspace, owner=owner)


def write_status(
    path: Path, status: str, workspace: Path | None = None, owner: Owner | None = None
) -> bool:
    """Set Status in an existing file, keeping everything else; False if the file is missing.

    Raises ValueError for a status that is not idle/working/blocked/done/killed, OSError when
    the file cannot be rewritten.
    """
    check_writable(status)

    def edit(old: str | None) -> str:
        assert old is not None  # create=False: a missing file returns before editing
        return edit_sections(old, {"status": [status]})

    return _rewrite(path, edit, create=False, workspace=workspace, owner=owner)
