"""Landlock through libc's syscall(): the ABI version, and a network ruleset that lets a process
connect over TCP to a few ports only, with abstract unix sockets and signals scoped to it.

Landlock needs no privilege (only no_new_privs) and is the egress guard's outer layer: its TCP
rules match ports, not addresses, so the connect broker (sidecar.egress.guard) decides those.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterable

# x86_64 syscall numbers.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_NET_PORT = 2
LANDLOCK_ACCESS_NET_CONNECT_TCP = 1 << 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
LANDLOCK_SCOPE_SIGNAL = 1 << 1

NET_ABI = 4  # TCP bind/connect rules
SCOPE_ABI = 6  # abstract unix sockets and signals

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class LandlockError(OSError):
    """Landlock refused a step; the message names it."""


def _call(nr: int, *args: object) -> int:
    ret = int(_syscall(ctypes.c_long(nr), *args))
    if ret < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"landlock syscall {nr}: {os.strerror(err)}")
    return ret


def abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is missing or disabled."""
    try:
        return _call(
            SYS_LANDLOCK_CREATE_RULESET,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
    except LandlockError:
        return 0


def restrict_connect(ports: Iterable[int], version: int) -> None:
    """From now on this process (and all it starts) may connect over TCP only to `ports`, and,
    from ABI 6, neither reach abstract unix sockets nor signal processes made outside this
    domain (the broker, the tmux server). Needs no_new_privs already set."""
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL
    if version >= SCOPE_ABI:
        attr = struct.pack("=QQQ", 0, LANDLOCK_ACCESS_NET_CONNECT_TCP, scoped)
    else:
        attr = struct.pack("=QQ", 0, LANDLOCK_ACCESS_NET_CONNECT_TCP)
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _call(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    try:
        for port in sorted(set(ports)):
            rule = ctypes.create_string_buffer(
                struct.pack("=QQ", LANDLOCK_ACCESS_NET_CONNECT_TCP, port), 16
            )
            _call(
                SYS_LANDLOCK_ADD_RULE,
                ctypes.c_int(fd),
                ctypes.c_int(LANDLOCK_RULE_NET_PORT),
                rule,
                ctypes.c_uint32(0),
            )
        _call(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0))
    finally:
        os.close(fd)
