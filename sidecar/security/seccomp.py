"""The egress guard's seccomp filter (x86_64) and its user-notification listener.

The filter refuses what no allowlist may reach (other ABIs, io_uring, TCP Fast Open, IP options,
a nested listener, socket pairs that carry datagrams) with an errno, lets the harmless socket
kinds through (an allowlist of family and type), and hands every connect() and every other
socket() to the broker in `sidecar.egress.guard` through the listener.
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
SYS_SOCKETPAIR = 53
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
SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET = 1, 2, 5
SOCK_TYPE_MASK = 0xF  # without SOCK_NONBLOCK and SOCK_CLOEXEC
SOL_IP, SOL_SOCKET, IPPROTO_TCP = 0, 1, 6
NETLINK_ROUTE = 0
MSG_FASTOPEN = 0x20000000
TCP_FASTOPEN_CONNECT = 30
IP_OPTIONS = 4  # source routes among them: the first hop would be an address nobody checked
SO_BINDTODEVICE, SO_BINDTOIFINDEX = 25, 62  # a device of the caller's choosing for its packets

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


def _endings(*errnos: int) -> tuple[_Insn, ...]:
    """Where a program's jumps end: "allow", "kill", and a label per errno (its name in lower
    case, "eperm") that fails the call with it."""
    out: list[_Insn] = [("label", "allow"), _ret(SECCOMP_RET_ALLOW)]
    out += [("label", "kill"), _ret(SECCOMP_RET_KILL_PROCESS)]
    for err in errnos:
        out += [("label", errno.errorcode[err].lower()), _errno(err)]
    return tuple(out)


PROGRAM: tuple[_Insn, ...] = (
    (_LD, _ARCH),
    (_JEQ, AUDIT_ARCH_X86_64, None, "kill"),  # the 32-bit ABI would skip every rule below
    (_LD, _NR),
    (_JGE, X32_SYSCALL_BIT, "enosys", None),  # and so would the x32 one
    (_JEQ, SYS_CONNECT, "notify", None),
    (_JEQ, SYS_SOCKET, "socket", None),
    (_JEQ, SYS_SOCKETPAIR, "socketpair", None),
    (_JEQ, SYS_SENDTO, "flags3", None),
    (_JEQ, SYS_SENDMMSG, "flags3", None),
    (_JEQ, SYS_SENDMSG, "flags2", None),
    (_JEQ, SYS_SETSOCKOPT, "sockopt", None),
    (_JEQ, SYS_SECCOMP, "seccomp", None),
    (_JEQ, SYS_IO_URING_SETUP, "enosys", None),  # its connect never passes this filter
    (_JEQ, SYS_IO_URING_ENTER, "enosys", None),
    (_JEQ, SYS_IO_URING_REGISTER, "enosys", None),
    _ret(SECCOMP_RET_ALLOW),
    ("label", "socket"),  # an allowlist of (family, type): everything else goes to the broker
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
    # Unix streams and seqpackets only: a datagram socket (SOCK_RAW becomes one) could sendmsg
    # to any path, a pointer seccomp cannot read.
    ("label", "unix"),
    (_LD, _arg(1)),
    (_AND, SOCK_TYPE_MASK),
    (_JEQ, SOCK_STREAM, "allow", None),
    (_JEQ, SOCK_SEQPACKET, "allow", "notify"),
    ("label", "socketpair"),  # the same for a pair (an unnamed datagram one can send to paths)
    (_LD, _arg(0)),
    (_JEQ, AF_UNIX, None, "eacces"),
    (_LD, _arg(1)),
    (_AND, SOCK_TYPE_MASK),
    (_JEQ, SOCK_STREAM, "allow", None),
    (_JEQ, SOCK_SEQPACKET, "allow", "eacces"),
    ("label", "netlink"),  # routes and addresses, as getaddrinfo and getifaddrs read them
    (_LD, _arg(2)),
    (_JEQ, NETLINK_ROUTE, "allow", "notify"),
    ("label", "flags3"),
    (_LD, _arg(3)),
    (_JSET, MSG_FASTOPEN, "enotsup", "allow"),
    ("label", "flags2"),
    (_LD, _arg(2)),
    (_JSET, MSG_FASTOPEN, "enotsup", "allow"),
    # The broker connects the caller's own socket: what it was told before (a deferred connect
    # taking its address from a later sendmsg, a source route, a device) would go with it.
    ("label", "sockopt"),
    (_LD, _arg(1)),
    (_JEQ, IPPROTO_TCP, "tcpopt", None),
    (_JEQ, SOL_IP, "ipopt", None),
    (_JEQ, SOL_SOCKET, None, "allow"),
    (_LD, _arg(2)),
    (_JEQ, SO_BINDTODEVICE, "eperm", None),
    (_JEQ, SO_BINDTOIFINDEX, "eperm", "allow"),
    ("label", "tcpopt"),
    (_LD, _arg(2)),
    (_JEQ, TCP_FASTOPEN_CONNECT, "enoprotoopt", "allow"),
    ("label", "ipopt"),
    (_LD, _arg(2)),
    (_JEQ, IP_OPTIONS, "eperm", "allow"),
    ("label", "seccomp"),
    # A newer filter's listener would get connect() first and could let it through unchecked.
    (_LD, _arg(1)),
    (_JSET, SECCOMP_FILTER_FLAG_NEW_LISTENER, "eperm", "allow"),
    ("label", "notify"),
    _ret(SECCOMP_RET_USER_NOTIF),
    *_endings(errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOPROTOOPT, errno.EPERM, errno.EACCES),
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
    # A killable-only wait once the broker holds the notification: a signal that interrupts a
    # connect the broker is making would otherwise leave the CLI unsure of its own socket.
    for flags in (SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, 0):
        fd = _load(PROGRAM, SECCOMP_FILTER_FLAG_NEW_LISTENER | flags)
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


# ---- the broker's own filter ---------------------------------------------------------------

# What the broker does once the CLI runs (measured with strace over every kind of call it
# answers): read /proc, answer notifications, connect and hand over sockets, report, forward
# signals, wait, run its connect threads; and what Python's runtime needs meanwhile.
BROKER_SYSCALLS = frozenset(
    {
        0, 1, 3, 5, 7, 8, 9, 10, 11, 12, 13, 14, 15,  # read write close fstat poll lseek mmap
        # mprotect munmap brk rt_sigaction rt_sigprocmask rt_sigreturn
        17, 19, 20, 24, 25, 28, 35, 39,  # pread64 readv writev sched_yield mremap madvise
        # nanosleep getpid
        SYS_CONNECT, SYS_SENDTO, 45, SYS_SENDMSG, 47, 51, 52, 55,  # recvfrom recvmsg
        # getsockname getpeername getsockopt
        60, 61, 72, 89, 97, 102, 104, 107, 108, 110, 131,  # exit wait4 fcntl readlink
        # getrlimit getuid getgid geteuid getegid getppid sigaltstack
        186, 202, 203, 204, 218, 219, 228, 230, 231, 234, 247,  # gettid futex sched_*affinity
        # set_tid_address restart_syscall clock_gettime clock_nanosleep exit_group tgkill waitid
        262, 267, 270, 271, 273, 289, 302, 318, 332, 334,  # newfstatat readlinkat pselect6 ppoll
        # set_robust_list signalfd4 prlimit64 getrandom statx rseq
        424, 434, 436, 438,  # pidfd_send_signal pidfd_open close_range pidfd_getfd
    }
)  # fmt: skip
SYS_IOCTL, SYS_CLONE, SYS_KILL, SYS_OPENAT, SYS_CLONE3 = 16, 56, 62, 257, 435
CLONE_THREAD = 0x10000
O_CHANGES = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC
TCGETS, TIOCGWINSZ, FIONBIO = 0x5401, 0x5413, 0x5421
BROKER_IOCTLS = (
    SECCOMP_IOCTL_NOTIF_RECV,
    SECCOMP_IOCTL_NOTIF_SEND,
    SECCOMP_IOCTL_NOTIF_ID_VALID,
    SECCOMP_IOCTL_NOTIF_ADDFD,
    TCGETS,
    TIOCGWINSZ,
    FIONBIO,
)


def broker_program() -> tuple[_Insn, ...]:
    """The broker's allowlist: what it needs, threads but no new process, no exec, files
    opened for reading only, unix and IPv4 sockets only; anything else fails with EPERM."""
    allowed = sorted(BROKER_SYSCALLS)
    return (
        (_LD, _ARCH),
        (_JEQ, AUDIT_ARCH_X86_64, None, "kill"),
        (_LD, _NR),
        (_JGE, X32_SYSCALL_BIT, "eperm", None),
        (_JEQ, SYS_CLONE3, "enosys", None),  # its flags are out of sight: glibc falls back
        (_JEQ, SYS_CLONE, "clone", None),
        (_JEQ, SYS_OPENAT, "openat", None),
        (_JEQ, SYS_IOCTL, "ioctl", None),
        (_JEQ, SYS_SOCKET, "socket", None),
        (_JEQ, SYS_KILL, "kill_pid", None),
        *((_JEQ, nr, "allow", None) for nr in allowed[:-1]),
        (_JEQ, allowed[-1], "allow", "eperm"),
        ("label", "clone"),
        (_LD, _arg(0)),
        (_JSET, CLONE_THREAD, "allow", "eperm"),
        ("label", "openat"),
        (_LD, _arg(2)),
        (_JSET, O_CHANGES, "eperm", "allow"),
        ("label", "ioctl"),
        (_LD, _arg(1)),
        *((_JEQ, cmd, "allow", None) for cmd in BROKER_IOCTLS[:-1]),
        (_JEQ, BROKER_IOCTLS[-1], "allow", "eperm"),
        ("label", "socket"),
        (_LD, _arg(0)),
        (_JEQ, AF_UNIX, "allow", None),
        (_JEQ, AF_INET, "allow", "eperm"),
        # One process (the CLI), never a group or every process it may signal: a pid of 0 or
        # below (the sign bit of the low 32 bits) would be.
        ("label", "kill_pid"),
        (_LD, _arg(0)),
        (_JEQ, 0, "eperm", None),
        (_JSET, 0x80000000, "eperm", "allow"),
        *_endings(errno.ENOSYS, errno.EPERM),
    )


def _load(program: tuple[_Insn, ...], flags: int) -> int:
    code = assemble(program)
    prog = _Fprog(len(code) // 8, code)
    return int(
        _libc.syscall(
            ctypes.c_long(SYS_SECCOMP),
            ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
            ctypes.c_uint(flags),
            ctypes.byref(prog),
        )
    )


def confine_broker() -> None:
    """Put this (single-threaded) broker under `broker_program`, no_new_privs first. Raises
    OSError naming what the kernel refused."""
    no_new_privs()
    if _load(broker_program(), 0) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter of the broker: {os.strerror(err)}")
