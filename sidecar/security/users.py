"""The CLI's user (`SIDECAR_USER`): parsed once into a `User`, and how a child process or this
process becomes it.

When the sidecar starts as root with `SIDECAR_USER`, tmux, ttyd and the CLI run as that user:
credentials set by `subprocess` between fork and exec, with no helper process. Standard library
only.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

MAX_ID = 2**32 - 2  # (uid_t)-1 means "unchanged" to the kernel


class UserError(ValueError):
    """SIDECAR_USER names no usable user; the message says why."""


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
