"""Least privilege: the CLI's user (`SIDECAR_USER`), the capabilities the sidecar keeps, and how
it acts in places that user owns.

When the sidecar starts as root with `SIDECAR_USER`, tmux, ttyd and the CLI run as that user
(credentials set by `subprocess` between fork and exec: no helper process), and init and the
supervisor keep only SETUID, SETGID and KILL. Without DAC_OVERRIDE, root reads and writes the
workspace *as the user* (`acting`: the thread's filesystem uid/gid, Linux's setfsuid), so a
symlink or a FIFO the agent plants can never make the sidecar touch more than the agent could.
Standard library and ctypes only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import grp
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

# linux/capability.h
CAP_CHOWN = 0
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_NET_BIND_SERVICE = 10
CAP_NAMES = {
    CAP_CHOWN: "CHOWN",
    CAP_KILL: "KILL",
    CAP_SETGID: "SETGID",
    CAP_SETUID: "SETUID",
    CAP_SETPCAP: "SETPCAP",
    CAP_NET_BIND_SERVICE: "NET_BIND_SERVICE",
}
#: What init and the supervisor keep with SIDECAR_USER: set the children's uid, gid and groups
#: (and the workspace thread's fsuid/fsgid), and signal the CLI's tree and its tmux server.
NEEDED_CAPS = frozenset({CAP_SETUID, CAP_SETGID, CAP_KILL})
_CAP_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel


class UserError(ValueError):
    """SIDECAR_USER names no usable user; the message says why."""


class PrivilegeError(OSError):
    """The kernel refused a credential or capability change."""


@dataclass(frozen=True)
class User:
    """The CLI's user, resolved once from SIDECAR_USER."""

    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups (from the group database, or none)
    name: str | None  # its passwd entry's name; None: a bare uid without an entry
    home: Path | None  # its passwd entry's home directory, when that exists

    @property
    def spec(self) -> str:
        return f"{self.name or self.uid} (uid {self.uid}, gid {self.gid})"


def _ident(text: str, what: str) -> int:
    if not text.isdigit() or not text.isascii():
        msg = f"{what} {text!r} must be a number"
        raise UserError(msg)
    value = int(text)
    if value > MAX_ID:
        msg = f"{what} {value} is out of range (0..{MAX_ID})"
        raise UserError(msg)
    return value


def _entry_home(entry: pwd.struct_passwd) -> Path | None:
    home = Path(entry.pw_dir) if entry.pw_dir else None
    return home if home is not None and home.is_absolute() and home.is_dir() else None


def parse_user(value: str) -> User:
    """`name`, `uid` or `uid:gid` -> User. Root (uid or gid 0) is refused: it gains nothing."""
    text = value.strip()
    name_part, sep, gid_part = text.partition(":")
    if not name_part or (sep and not gid_part):
        msg = f"{value!r} is not a user name, a uid or uid:gid"
        raise UserError(msg)
    if name_part.isdigit():
        uid = _ident(name_part, "uid")
        try:
            entry: pwd.struct_passwd | None = pwd.getpwuid(uid)
        except KeyError:
            entry = None
    elif sep:
        msg = f"{value!r}: give a uid before ':' (uid:gid), or a user name alone"
        raise UserError(msg)
    else:
        try:
            entry = pwd.getpwnam(name_part)
        except KeyError:
            msg = f"unknown user {name_part!r} (no passwd entry); give a uid or uid:gid instead"
            raise UserError(msg) from None
        uid = entry.pw_uid
    # A bare uid without an entry gets the group of the same number (not Docker's gid 0).
    gid = _ident(gid_part, "gid") if sep else (entry.pw_gid if entry else uid)
    if uid == 0 or gid == 0:
        msg = f"{value!r} is root (uid or gid 0); the CLI must run as an unprivileged user"
        raise UserError(msg)
    groups: tuple[int, ...] = ()
    if entry is not None:
        groups = tuple(g for g in os.getgrouplist(entry.pw_name, gid) if g not in (gid, 0))
    return User(
        uid=uid,
        gid=gid,
        groups=groups,
        name=entry.pw_name if entry else None,
        home=_entry_home(entry) if entry else None,
    )


class Credentials(TypedDict, total=False):
    user: int
    group: int
    extra_groups: list[int]


def spawn_credentials(user: User | None) -> Credentials:
    """`subprocess`/asyncio keyword arguments that start a child as `user` ({} for None):
    the uid, gid and supplementary groups are set between fork and exec."""
    if user is None:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}


def user_env(env: Mapping[str, str], user: User | None, home: Path | None) -> dict[str, str]:
    """The CLI's environment: `env` with HOME, USER and LOGNAME of the CLI's user."""
    out = dict(env)
    if user is None or home is None:
        return out
    out["HOME"] = str(home)
    name = user.name or str(user.uid)
    out["USER"] = out["LOGNAME"] = name
    out.pop("MAIL", None)
    return out


# ---- capabilities ---------------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mask_of(caps: Iterable[int]) -> int:
    mask = 0
    for cap in caps:
        mask |= 1 << cap
    return mask


def _caps_in(mask: int) -> frozenset[int]:
    return frozenset(bit for bit in range(64) if mask >> bit & 1)


def current_caps(kind: str = "CapEff", pid: int | str = "self") -> frozenset[int]:
    """The capabilities in `kind` (CapEff, CapPrm, CapBnd, ...) from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(f"{kind}:"):
                return _caps_in(int(line.split()[1], 16))
    return frozenset()


def cap_names(caps: Iterable[int]) -> str:
    return ", ".join(CAP_NAMES.get(c, str(c)) for c in sorted(caps))


def keep_only(keep: Iterable[int]) -> None:
    """Drop every capability but `keep` from the bounding, ambient, inheritable, permitted and
    effective sets of this (single-threaded) process; what a fork inherits afterwards too.

    capset is per thread in the kernel, so this runs before any thread exists (glibc does not
    broadcast it). The bounding set needs SETPCAP to shrink; without it (a runtime that already
    limited it, such as Docker's --cap-drop) it stays as the runtime made it."""
    libc = _libc()
    wanted = frozenset(keep)
    if CAP_SETPCAP in current_caps():
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text(encoding="ascii"))
        for cap in range(last + 1):
            if cap not in wanted and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                if err != errno.EINVAL:
                    raise PrivilegeError(err, f"cannot drop capability {cap} from the bound")
    # Ambient capabilities would survive an exec into the children: none.
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    mask = _mask_of(wanted & current_caps("CapPrm"))
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in (0, 1):
        part = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = part
        data[i].inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(err, f"capset failed: {os.strerror(err)}")


# ---- acting as the user in its files --------------------------------------------------------


def _setfs(which: str, ident: int) -> int:
    # setfsuid/setfsgid change only the calling thread's filesystem identity (glibc does not
    # broadcast them), and they return the previous value whether or not they succeeded.
    func = getattr(_libc(), which)
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


@contextlib.contextmanager
def acting(owner: Owner | None) -> Iterator[None]:
    """`owner.acting()`, or nothing for None (the sidecar and the CLI are one user)."""
    if owner is None:
        yield
    else:
        with owner.acting():
            yield


def claim(owner: Owner | None, fd: int) -> None:
    if owner is not None:
        owner.claim(fd)


def keep_owner(fd: int, like: os.stat_result) -> None:
    """A rewrite's new file gets the old one's mode and, where allowed, its owner."""
    os.fchmod(fd, stat.S_IMODE(like.st_mode))
    if (like.st_uid, like.st_gid) != (os.fstat(fd).st_uid, os.fstat(fd).st_gid):
        # Allowed to root (CAP_CHOWN); as the file's own user it is a no-op or refused.
        with contextlib.suppress(PermissionError):
            os.fchown(fd, like.st_uid, like.st_gid)


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


def can_search(user: User, path: Path) -> bool:
    """Whether `user` may pass through `path` and every directory above it (mode bits only)."""
    groups = {user.gid, *user.groups}
    for part in [path, *path.parents]:
        try:
            st = os.stat(part)
        except OSError:
            return False
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return False
    return True


# ---- files in places another user can write -------------------------------------------------

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


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def become(user: User) -> None:
    """Turn this (root) process into `user` for good: groups, gid, uid; before an exec."""
    os.setgroups(list(user.groups))
    os.setresgid(user.gid, user.gid, user.gid)
    os.setresuid(user.uid, user.uid, user.uid)
