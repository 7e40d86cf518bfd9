"""What the CLI's user may do to a path by mode bits and owners alone: read it, write it, pass
through it, or replace it through a directory above. The sidecar runs as root there, so the
kernel's access() would answer for root; these answer for the user (no ACLs, no capabilities).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sidecar.security.users import User

READ, WRITE, SEARCH = 4, 2, 1  # the rwx bits of one class


def permits(user: User, st: os.stat_result, bit: int) -> bool:
    """Whether `user` has `bit` on the file `st` describes: the class the kernel picks (owner,
    else group, else others) decides, as it does."""
    if st.st_uid == user.uid:
        shift = 6
    elif st.st_gid in (user.gid, *user.groups):
        shift = 3
    else:
        shift = 0
    return bool(st.st_mode >> shift & bit)


def can_search(user: User, path: Path) -> bool:
    """Whether `user` may pass through `path` and every directory above it."""
    for part in [path, *path.parents]:
        try:
            st = os.stat(part)
        except OSError:
            return False
        if not permits(user, st, SEARCH):
            return False
    return True


def _modes(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}:{st.st_gid}"


def _own_problem(user: User, path: Path, bit: int, verb: str) -> str | None:
    """Why `user` can `verb` `path` itself (its owner may change the mode first), or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if st.st_uid == user.uid:
        return f"{path} belongs to it"
    if permits(user, st, bit):
        return f"{path} lets it {verb} ({_modes(st)})"
    return None


def readable_by(user: User, path: Path) -> str | None:
    """Why `user` can read `path` (its owner, or the mode lets it), or None."""
    return _own_problem(user, path, READ, "read")


def changeable_by(user: User, path: Path) -> str | None:
    """Why `user` can change what `path` holds, or None: it owns or may write `path`; or a
    directory above it (as given, and as symlinks resolve it) lets it rename entries (it owns
    it, or may write it and it is not sticky); or `path` is missing and the nearest directory
    that exists lets it make it (sticky or not)."""
    why = _own_problem(user, path, WRITE, "write")
    if why is not None:
        return why
    path = path.absolute()
    if not os.path.lexists(path):
        nearest = next(p for p in path.parents if p.exists())
        st = os.stat(nearest)
        if st.st_uid == user.uid or permits(user, st, WRITE):
            return f"{path} is missing and {nearest} lets it make it ({_modes(st)})"
    for folder in dict.fromkeys([*path.parents, *Path(os.path.realpath(path)).parents]):
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if st.st_uid == user.uid:
            return f"{folder} above it belongs to it"
        if permits(user, st, WRITE) and not st.st_mode & stat.S_ISVTX:
            return f"{folder} above it lets it rename entries ({_modes(st)})"
    return None
