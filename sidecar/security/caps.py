"""The capabilities init and the supervisor keep with `SIDECAR_USER`, and dropping the rest.

Started as root to run the CLI as another user, the sidecar needs only SETUID, SETGID and KILL;
everything else goes from every set before any thread exists (capset is per thread). Standard
library and ctypes only.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
from collections.abc import Iterable
from pathlib import Path

# linux/capability.h
CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_NET_BIND_SERVICE = 10
#: What lets root read, write and search files whatever their mode (and nothing more).
FILE_ACCESS = (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)
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


class PrivilegeError(OSError):
    """The kernel refused a credential or capability change."""


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


@functools.cache
def libc() -> ctypes.CDLL:
    """The C library, for the calls Python's `os` lacks (capset, prctl, setfsuid)."""
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
    lib = libc()
    wanted = frozenset(keep)
    if CAP_SETPCAP in current_caps():
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text(encoding="ascii"))
        for cap in range(last + 1):
            if cap not in wanted and lib.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                err = ctypes.get_errno()
                if err != errno.EINVAL:
                    raise PrivilegeError(err, f"cannot drop capability {cap} from the bound")
    # Ambient capabilities would survive an exec into the children: none.
    lib.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    mask = _mask_of(wanted & current_caps("CapPrm"))
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in (0, 1):
        part = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = part
        data[i].inheritable = 0
    if lib.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(err, f"capset failed: {os.strerror(err)}")
