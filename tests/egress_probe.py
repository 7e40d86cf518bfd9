"""Tries every way around the egress guard from where it runs and prints what happened as one
JSON object: {"check": "ok" | errno name | "killed by SIGNAL"}. Standard library only, so an
unprivileged uid runs it with the system's Python.

Usage: egress_probe.py ALLOWED_PORT FORBIDDEN_PORT ABSTRACT_NAME (echo servers on 127.0.0.1).
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Callable

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MSG_FASTOPEN = 0x20000000
TCP_FASTOPEN_CONNECT = 30
IPPROTO_MPTCP = 262
AF_PACKET = 17


def outcome(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def echo(addr: tuple[str, int]) -> None:
    with socket.create_connection(addr, timeout=5) as s:
        s.sendall(b"ping")
        if s.recv(4) != b"ping":
            raise OSError(errno.EPROTO, "no echo")


def nonblocking(addr: tuple[str, int]) -> None:
    """Node's way: a non-blocking socket, connect -> EINPROGRESS, wait until writable."""
    with socket.socket() as s:
        s.setblocking(False)
        err = s.connect_ex(addr)
        if err not in {errno.EINPROGRESS, 0}:
            raise OSError(err, os.strerror(err))
        select.select([], [s], [], 5)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            raise OSError(err, os.strerror(err))
        s.setblocking(True)
        s.sendall(b"ping")
        if s.recv(4) != b"ping":
            raise OSError(errno.EPROTO, "no echo")


def make(family: int, kind: int, proto: int = 0) -> None:
    socket.socket(family, kind, proto).close()


def syscall(nr: int, *args: object) -> None:
    if libc.syscall(ctypes.c_long(nr), *args) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def io_uring() -> None:
    params = ctypes.create_string_buffer(120)
    syscall(425, ctypes.c_uint(8), params)


def tfo_sendto(addr: tuple[str, int]) -> None:
    with socket.socket() as s:
        s.sendto(b"x", MSG_FASTOPEN, addr)


def tfo_sendmsg(addr: tuple[str, int]) -> None:
    with socket.socket() as s:
        s.sendmsg([b"x"], [], MSG_FASTOPEN, addr)


def tfo_option() -> None:
    with socket.socket() as s:
        s.setsockopt(socket.IPPROTO_TCP, TCP_FASTOPEN_CONNECT, 1)


def nested_listener() -> None:
    """A filter of our own with a listener (allow-all program: one `ret ALLOW`)."""
    insn = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000), 8)

    class Fprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    prog = Fprog(1, ctypes.cast(insn, ctypes.c_void_p))
    libc.prctl(38, 1, 0, 0, 0)  # no_new_privs (already set under the guard)
    syscall(317, ctypes.c_uint(1), ctypes.c_uint(1 << 3), ctypes.byref(prog))


def abstract(name: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\0" + name)


def i386() -> str:
    """`int 0x80` (getpid through the 32-bit ABI) in a forked child: how the child ended."""
    code = bytes.fromhex("b814000000" + "cd80" + "c3")  # mov eax, 20; int 0x80; ret
    pid = os.fork()
    if pid == 0:
        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return "ok"


def main() -> None:
    allowed, forbidden, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    here = ("127.0.0.1", allowed)
    elsewhere = ("127.0.0.2", allowed)
    checks: dict[str, Callable[[], object]] = {
        "allowed": lambda: echo(here),
        "allowed_nonblocking": lambda: nonblocking(here),
        "other_address": lambda: echo(elsewhere),
        "other_port": lambda: echo(("127.0.0.1", forbidden)),
        "udp": lambda: make(socket.AF_INET, socket.SOCK_DGRAM),
        "ipv6": lambda: make(socket.AF_INET6, socket.SOCK_STREAM),
        "ipv6_loopback": lambda: echo(("::1", allowed)),
        "raw": lambda: make(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
        "icmp_dgram": lambda: make(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
        "packet": lambda: make(AF_PACKET, socket.SOCK_RAW),
        "netlink_route": lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 0),
        "netlink_generic": lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 16),
        "netlink_netfilter": lambda: make(socket.AF_NETLINK, socket.SOCK_RAW, 12),
        "sctp": lambda: make(socket.AF_INET, socket.SOCK_STREAM, 132),
        "mptcp": lambda: make(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP),
        "io_uring": io_uring,
        "tfo_sendto": lambda: tfo_sendto(elsewhere),
        "tfo_sendmsg": lambda: tfo_sendmsg(elsewhere),
        "tfo_option": tfo_option,
        "unix_dgram": lambda: make(socket.AF_UNIX, socket.SOCK_DGRAM),
        "abstract": lambda: abstract(name),
        "x32": lambda: syscall(0x40000000 | 39),
    }
    results = {key: outcome(check) for key, check in checks.items()}
    results["nested_listener"] = outcome(nested_listener)  # last: it filters this process
    results["i386"] = i386()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
