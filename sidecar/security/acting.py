"""How the sidecar acts in places the CLI's user owns: the workspace, and the user's PATH.

Without DAC_OVERRIDE, root reads and writes there *as the user* (`acting`: the thread's
filesystem uid/gid, Linux's setfsuid), so a symlink or a FIFO the agent plants can never make
the sidecar touch more than the agent could. Standard library and ctypes only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sidecar.security.caps import PrivilegeError, libc
from sidecar.security.users import User


def _setfs(which: str, ident: int) -> int:
    # setfsuid/setfsgid change only the calling thread's filesystem identity (glibc does not
    # broadcast them), and they return the previous value whether or not they succeeded.
    func = getattr(libc(), which)
    func.restype = ctypes.c_int
    return int(func(ctypes.c_uint(ident & 0xFFFFFFFF)))


@dataclass(frozen=True)
class Owner:
    """Who owns what the sidecar creates in the workspace, and how that comes about.

    `act_as` (SIDECAR_USER): file work runs with the user's filesystem uid/gid in the calling
    thread, so the kernel checks it as the user's and new files are the user's. Otherwise (a
    root sidecar whose CLI is root too, in a workspace someone else owns): files are made as
    root and then given to the workspace's owner."""

    uid: int
    gid: int
    act_as: bool

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        if not self.act_as:
            yield
            return
        old_gid = _setfs("setfsgid", self.gid)
        old_uid = _setfs("setfsuid", self.uid)
        try:
            if _setfs("setfsuid", self.uid) != self.uid:
                msg = f"cannot act as uid {self.uid} (setfsuid refused: no CAP_SETUID?)"
                raise PrivilegeError(errno.EPERM, msg)
            yield
        finally:
            _setfs("setfsuid", old_uid)
            _setfs("setfsgid", old_gid)

    def claim(self, fd: int) -> None:
        """Give a file or directory the sidecar has just made to the owner (chown mode)."""
        if not self.act_as:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, self.uid, self.gid)


_AS_ITSELF = contextlib.nullcontext()  # reusable: acting changes nothing


def acting(owner: Owner | None) -> contextlib.AbstractContextManager[None]:
    """`owner.acting()`, or nothing when the sidecar acts as itself: None (the sidecar and the
    CLI are one user) or an owner that is given files rather than acted as (a shared no-op: a
    `stat` per scrape and per request goes through here)."""
    if owner is None or not owner.act_as:
        return _AS_ITSELF
    return owner.acting()


def claim(owner: Owner | None, fd: int) -> None:
    if owner is not None:
        owner.claim(fd)


def workspace_owner(user: User | None, workspace: Path, euid: int) -> Owner | None:
    """How the sidecar acts in the workspace: as SIDECAR_USER; as root, giving what it makes to
    the workspace's owner; or (not root) as itself (None)."""
    if user is not None:
        return Owner(user.uid, user.gid, act_as=True)
    if euid != 0:
        return None
    try:
        st = os.stat(workspace)
    except OSError:
        return None
    return Owner(st.st_uid, st.st_gid, act_as=False) if st.st_uid != 0 else None


def which(name: str, path: str, owner: Owner | None) -> str | None:
    """`shutil.which` as the CLI's user sees it: root without DAC_OVERRIDE cannot look into the
    user's own PATH directories, and root's access() would answer for root anyway."""
    if owner is None or not owner.act_as:
        return shutil.which(name, path=path)
    if "/" in name:
        candidates = [name]
    else:
        candidates = [os.path.join(d or ".", name) for d in path.split(os.pathsep)]
    with acting(owner):
        for candidate in candidates:
            try:
                if os.path.isfile(candidate) and os.access(
                    candidate, os.X_OK, effective_ids=os.access in os.supports_effective_ids
                ):
                    return candidate
            except OSError:
                continue
    return None
