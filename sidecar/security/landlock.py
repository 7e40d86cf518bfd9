"""Landlock through libc's syscall(): the ABI version, and rulesets that confine a process (and
all it starts): TCP connects to a few ports, abstract unix sockets and signals scoped to it, and
the files it may read or change (`grant_beneath` computes the rules for "all but these").

Landlock needs no privilege (only no_new_privs) and is the egress guard's outer layer: its TCP
rules match ports, not addresses, so the connect broker (sidecar.egress.broker) decides those.
Its rules only ever grant: a path is denied by granting everything around it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

# x86_64 syscall numbers.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2
LANDLOCK_ACCESS_NET_CONNECT_TCP = 1 << 1
LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
LANDLOCK_SCOPE_SIGNAL = 1 << 1

# Filesystem rights (linux/landlock.h). A right on a directory holds for all beneath it.
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2: link or rename into another directory
FS_TRUNCATE = 1 << 14  # ABI 3
#: Every way to change what a path holds: write, truncate, make, remove, link or rename.
FS_CHANGE = (
    FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_CHAR
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_BLOCK
    | FS_MAKE_SYM
    | FS_REFER
    | FS_TRUNCATE
)
#: The rights that mean something on a file (a rule on a file may carry only these).
FS_ON_FILE = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE

NET_ABI = 4  # TCP bind/connect rules; filesystem rules, REFER and TRUNCATE came before
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


class Ruleset:
    """One Landlock layer: what it handles is denied but for what its rules grant. `fs`,
    `net`: the handled rights; `scoped` (ABI 6): abstract unix sockets and signals kept to
    this domain. `restrict` applies it to this process (no_new_privs already set)."""

    def __init__(self, *, fs: int = 0, net: int = 0, scoped: int = 0) -> None:
        attr = struct.pack("=QQQ", fs, net, scoped) if scoped else struct.pack("=QQ", fs, net)
        buf = ctypes.create_string_buffer(attr, len(attr))
        self.fd = _call(
            SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)
        )

    def _add(self, kind: int, rule: bytes) -> None:
        buf = ctypes.create_string_buffer(rule, len(rule))
        _call(
            SYS_LANDLOCK_ADD_RULE,
            ctypes.c_int(self.fd),
            ctypes.c_int(kind),
            buf,
            ctypes.c_uint32(0),
        )

    def allow_port(self, port: int) -> None:
        self._add(LANDLOCK_RULE_NET_PORT, struct.pack("=QQ", LANDLOCK_ACCESS_NET_CONNECT_TCP, port))

    def allow_path(self, path: Path, rights: int) -> None:
        """`rights` beneath `path` (a file keeps only the rights a file can have)."""
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                rights &= FS_ON_FILE
            if rights:
                # struct landlock_path_beneath_attr is packed: u64 rights, s32 fd.
                self._add(LANDLOCK_RULE_PATH_BENEATH, struct.pack("=Qi", rights, fd))
        finally:
            os.close(fd)

    def restrict(self) -> None:
        try:
            _call(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(self.fd), ctypes.c_uint32(0))
        finally:
            os.close(self.fd)


def restrict_connect(ports: Iterable[int], version: int) -> None:
    """From now on this process (and all it starts) may connect over TCP only to `ports`, and,
    from ABI 6, neither reach abstract unix sockets nor signal processes made outside this
    domain (the broker, the tmux server). Needs no_new_privs already set."""
    scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL
    ruleset = Ruleset(net=LANDLOCK_ACCESS_NET_CONNECT_TCP, scoped=scoped * (version >= SCOPE_ABI))
    with _closed_on_error(ruleset):
        for port in sorted(set(ports)):
            ruleset.allow_port(port)
    ruleset.restrict()


def restrict_files(rights: int, allowed: Iterable[Path]) -> None:
    """From now on this process (and all it starts) has `rights` only beneath `allowed`
    (`grant_beneath` computes them). Needs no_new_privs already set."""
    ruleset = Ruleset(fs=rights)
    with _closed_on_error(ruleset):
        for path in allowed:
            with contextlib.suppress(FileNotFoundError):  # nothing there to grant
                ruleset.allow_path(path, rights)
    ruleset.restrict()


@contextlib.contextmanager
def _closed_on_error(ruleset: Ruleset) -> Iterator[None]:
    try:
        yield
    except BaseException:
        os.close(ruleset.fd)
        raise


@dataclass(frozen=True)
class _Tree:
    roots: tuple[Path, ...]
    denied: tuple[Path, ...]

    def walk(self, path: Path) -> Iterator[Path]:
        if any(path.is_relative_to(d) for d in self.denied):
            return  # inside a denied path: nothing of it
        if not any(d.is_relative_to(path) for d in self.denied):
            yield path  # nothing denied beneath: the whole of it
            return
        # An ancestor of something denied: no right on it (it would hold beneath it too), so
        # each entry but the way to the denied path gets its own rule. Symlinks get none: the
        # kernel checks the path they lead to.
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in sorted(entries, key=lambda e: e.name):
            if not entry.is_symlink():
                yield from self.walk(Path(entry.path))


def grant_beneath(roots: Iterable[Path], denied: Iterable[Path]) -> list[Path]:
    """The paths whose rules grant a right everywhere beneath `roots` but in `denied` (both
    taken as the kernel sees them: symlinks resolved). The ancestors of a denied path get no
    rule of their own, only their other entries: their own direct entries lose the right."""
    tree = _Tree(tuple(Path(os.path.realpath(r)) for r in roots), _resolved(denied))
    return [path for root in tree.roots for path in tree.walk(root)]


def _resolved(paths: Iterable[Path]) -> tuple[Path, ...]:
    return tuple(Path(os.path.realpath(p)) for p in paths)
