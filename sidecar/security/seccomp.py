"""The egress guard's seccomp filter (x86_64) and its user-notification listener.

The filter refuses what no allowlist may reach (other ABIs, io_uring, TCP Fast Open, a nested
listener) with an errno, lets the harmless socket kinds through, and hands every connect() and
every other socket() to the broker in `sidecar.egress.guard` through the listener.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from dataclasses import dataclass

# x86_64 syscall numbers.
SYS_SOCKET = 41
SYS_CONNECT = 42
SYS_SENDTO = 44
SYS_SENDMSG = 46
SYS_SETSOCKOPT = 54
SYS_SECCOMP = 317
SYS_SENDMMSG = 307
SYS_IO_URING_SETUP = 425
SYS_IO_URING_ENTER = 426
SYS_IO_URING_REGISTER = 427
X32_SYSCALL_BIT = 0x40000000
AUDIT_ARCH_X86_64 = 0xC000003E

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_IOCTL_NOTIF_RECV = 0xC0502100
SECCOMP_IOCTL_NOTIF_SEND = 0xC0182101
SECCOMP_IOCTL_NOTIF_ID_VALID = 0x40082102
SECCOMP_IOCTL_NOTIF_ADDFD = 0x40182103
SECCOMP_ADDFD_FLAG_SETFD = 1
PR_SET_NO_NEW_PRIVS = 38

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
SOCK_STREAM, SOCK_DGRAM = 1, 2
SOCK_TYPE_MASK = 0xF  # without SOCK_NONBLOCK and SOCK_CLOEXEC
IPPROTO_TCP = 6
NETLINK_ROUTE = 0
MSG_FASTOPEN = 0x20000000
TCP_FASTOPEN_CONNECT = 30

# seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments (the low 32 bits of
# argument i at 16 + 8 i on little-endian x86_64).
_NR, _ARCH = 0, 4


def _arg(i: int) -> int:
    return 16 + 8 * i


_LD, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06

# The program with symbolic jump targets (resolved by `assemble`): ("label", name) marks a
# place; a jump is (code, k, target-if-true or None, target-if-false or None).
_Insn = tuple[object, ...]


def _ret(action: int) -> _Insn:
    return (_RET, action)


def _errno(err: int) -> _Insn:
    return _ret(SECCOMP_RET_ERRNO | err)


PROGRAM: tuple[_Insn, ...] = (
    (_LD, _ARCH),
    (_JEQ, AUDIT_ARCH_X86_64, None, "kill"),  # the 32-bit ABI would skip every rule below
    (_LD, _NR),
    (_JGE, X32_SYSCALL_BIT, "enosys", None),  # and so would the x32 one
    (_JEQ, SYS_CONNECT, "notify", None),
    (_JEQ, SYS_SOCKET, "socket", None),
    (_JEQ, SYS_SENDTO, "flags3", None),
    (_JEQ, SYS_SENDMMSG, "flags3", None),
    (_JEQ, SYS_SENDMSG, "flags2", None),
    (_JEQ, SYS_SETSOCKOPT, "sockopt", None),
    (_JEQ, SYS_SECCOMP, "seccomp", None),
    (_JEQ, SYS_IO_URING_SETUP, "enosys", None),  # its connect never passes this filter
    (_JEQ, SYS_IO_URING_ENTER, "enosys", None),
    (_JEQ, SYS_IO_URING_REGISTER, "enosys", None),
    _ret(SECCOMP_RET_ALLOW),
    ("label", "socket"),
    (_LD, _arg(0)),
    (_JEQ, AF_INET, "inet", None),
    (_JEQ, AF_UNIX, "unix", None),
    (_JEQ, AF_NETLINK, "netlink", "notify"),
    ("label", "inet"),  # TCP only: not UDP, raw, SCTP or MPTCP (Landlock rules cover TCP)
    (_LD, _arg(1)),
    (_AND, SOCK_TYPE_MASK),
    (_JEQ, SOCK_STREAM, None, "notify"),
    (_LD, _arg(2)),
    (_JEQ, 0, "allow", None),
    (_JEQ, IPPROTO_TCP, "allow", "notify"),
    ("label", "unix"),  # a datagram one could sendmsg() to any path, a pointer seccomp can't read
    (_LD, _arg(1)),
    (_AND, SOCK_TYPE_MASK),
    (_JEQ, SOCK_DGRAM, "notify", "allow"),
    ("label", "netlink"),  # routes and addresses, as getaddrinfo and getifaddrs read them
    (_LD, _arg(2)),
    (_JEQ, NETLINK_ROUTE, "allow", "notify"),
    ("label", "flags3"),
    (_LD, _arg(3)),
    (_JSET, MSG_FASTOPEN, "eopnotsupp", "allow"),
    ("label", "flags2"),
    (_LD, _arg(2)),
    (_JSET, MSG_FASTOPEN, "eopnotsupp", "allow"),
    ("label", "sockopt"),  # a deferred connect would take its address from a later sendmsg
    (_LD, _arg(1)),
    (_JEQ, IPPROTO_TCP, None, "allow"),
    (_LD, _arg(2)),
    (_JEQ, TCP_FASTOPEN_CONNECT, "enoprotoopt", "allow"),
    ("label", "seccomp"),
    # A newer filter's listener would get connect() first and could let it through unchecked.
    (_LD, _arg(1)),
    (_JSET, SECCOMP_FILTER_FLAG_NEW_LISTENER, "eperm", "allow"),
    ("label", "notify"),
    _ret(SECCOMP_RET_USER_NOTIF),
    ("label", "allow"),
    _ret(SECCOMP_RET_ALLOW),
    ("label", "kill"),
    _ret(SECCOMP_RET_KILL_PROCESS),
    ("label", "enosys"),
    _errno(errno.ENOSYS),
    ("label", "eopnotsupp"),
    _errno(errno.EOPNOTSUPP),
    ("label", "enoprotoopt"),
    _errno(errno.ENOPROTOOPT),
    ("label", "eperm"),
    _errno(errno.EPERM),
)


def assemble(program: tuple[_Insn, ...]) -> bytes:
    """struct sock_filter[] for `program`; every jump goes forward, as BPF requires."""
    labels: dict[object, int] = {}
    insns: list[_Insn] = []
    for insn in program:
        if insn[0] == "label":
            labels[insn[1]] = len(insns)
        else:
            insns.append(insn)
    out = []
    for pc, insn in enumerate(insns):
        code, k = int(insn[0]), int(insn[1])  # type: ignore[call-overload]
        jt = jf = 0
        if len(insn) == 4:
            jt, jf = (0 if t is None else labels[t] - pc - 1 for t in insn[2:])
            assert 0 <= jt < 256 and 0 <= jf < 256, insn
        out.append(struct.pack("=HBBI", code, jt, jf, k))
    return b"".join(out)


class _Fprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def no_new_privs() -> None:
    """What Landlock and an unprivileged seccomp filter both need: no exec gains privileges."""
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")


def install() -> int:
    """Install the filter on this single-threaded process (no_new_privs set); return the
    listener fd. Raises OSError naming what the kernel refused."""
    code = assemble(PROGRAM)
    prog = _Fprog(len(code) // 8, code)
    # A killable-only wait once the broker holds the notification: a signal that interrupts a
    # connect the broker is making would otherwise leave the CLI unsure of its own socket.
    for flags in (SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, 0):
        fd = int(
            _libc.syscall(
                ctypes.c_long(SYS_SECCOMP),
                ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                ctypes.c_uint(SECCOMP_FILTER_FLAG_NEW_LISTENER | flags),
                ctypes.byref(prog),
            )
        )
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EINVAL:
            break
    raise OSError(err, f"seccomp user notification: {os.strerror(err)}")


@dataclass(frozen=True)
class Notification:
    id: int
    pid: int  # the thread in the syscall (a tid)
    nr: int
    args: tuple[int, ...]


def receive(listener: int) -> Notification | None:
    """The next notification; None when its caller is already gone (ENOENT) or none waits."""
    buf = bytearray(80)  # struct seccomp_notif, zeroed as the kernel requires
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, buf, True)
    except (InterruptedError, BlockingIOError):
        return None
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise
    nid, pid, _flags, nr, _arch, _ip, *args = struct.unpack("=QIIiIQ6Q", buf)
    return Notification(nid, pid, nr, tuple(args))


def still_valid(listener: int, nid: int) -> bool:
    """The caller still waits in this syscall, so a pid or memory read about it was its own."""
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, struct.pack("=Q", nid))
    except OSError:
        return False
    return True


def respond(listener: int, nid: int, err: int = 0) -> None:
    """Answer the syscall: 0 for success, else fail it with errno `err`."""
    resp = bytearray(struct.pack("=QqiI", nid, 0, -err, 0))
    try:
        fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp, True)
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # the caller was killed or interrupted meanwhile
            raise


def add_fd(listener: int, nid: int, fd: int, target: int, flags: int) -> None:
    """Put the broker's `fd` into the caller at fd number `target` (as dup2 would), with
    `flags` (O_CLOEXEC or 0), while it waits in syscall `nid`."""
    addfd = struct.pack("=QIIII", nid, SECCOMP_ADDFD_FLAG_SETFD, fd, target, flags)
    fcntl.ioctl(listener, SECCOMP_IOCTL_NOTIF_ADDFD, addfd)
