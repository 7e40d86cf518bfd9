"""What the connect broker learns from the kernel about the processes it deals with: a caller's
thread group, file flags and unix sockets, whether a listening process is inside a guard; and
connect(2) on a raw fd with an address of the broker's own making. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
from pathlib import Path

SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the peer (of the listener, for a connected socket)
UNIX_TYPES = {1: socket.SOCK_STREAM, 5: socket.SOCK_SEQPACKET}  # /proc/net/unix's Type
UNIX_CONNECTED = "03"  # SS_CONNECTED in /proc/net/unix's St

_libc = ctypes.CDLL(None, use_errno=True)


def sockaddr_in(host: str, port: int) -> bytes:
    return (
        struct.pack("=H", socket.AF_INET)
        + struct.pack("!H", port)
        + socket.inet_aton(host)
        + bytes(8)
    )


def sockaddr_un(path: bytes) -> bytes:
    return struct.pack("=H", socket.AF_UNIX) + path + b"\0"


def connect(fd: int, addr: bytes) -> int:
    """connect(2) on a raw fd; 0 or the errno (EINPROGRESS for a non-blocking socket)."""
    buf = ctypes.create_string_buffer(addr, len(addr))
    if _libc.connect(fd, buf, len(addr)) == 0:
        return 0
    return ctypes.get_errno()


def tgid(tid: int) -> int:
    for line in Path(f"/proc/{tid}/status").read_text().splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    msg = f"no Tgid for {tid}"
    raise ValueError(msg)


def fd_flags(pid: int, fd: int) -> int:
    """The file status flags of `pid`'s `fd` (octal `flags:` in /proc/PID/fdinfo)."""
    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    return 0


def unix_row(pid: int, fd: int) -> list[str] | None:
    """`pid`'s `fd` as /proc/PID/net/unix lists it (Num RefCount Protocol Flags Type St Inode
    [Path]); None when it is no unix socket."""
    link = os.readlink(f"/proc/{pid}/fd/{fd}")  # socket:[INODE]
    if not link.startswith("socket:["):
        return None
    inode = link.removeprefix("socket:[").removesuffix("]")
    with open(f"/proc/{pid}/net/unix") as table:
        return next((row for line in table if (row := line.split())[6:7] == [inode]), None)


def guard_marks(pid: int) -> tuple[bool, int]:
    """`pid`'s no_new_privs and how many seccomp filters it runs under (/proc/PID/status)."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("NoNewPrivs", "Seccomp_filters"):
                fields[name] = int(value)
    return fields.get("NoNewPrivs") == 1, fields.get("Seccomp_filters", 0)


def listener_inside(sock: socket.socket, outside_filters: int) -> bool:
    """Whether the process that listens at the other end of the connected unix socket `sock`
    is inside a guard: no_new_privs, and more seccomp filters than `outside_filters` (what the
    processes outside have here: the runtime's). Nothing outside can have ours without being
    started inside. Its pidfd, where the kernel gives one, proves the pid is still that
    process when its status was read."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    except OSError:
        return False
    pid = struct.unpack("=iII", creds)[0]
    try:
        pidfd: int | None = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        pidfd = None
    try:
        no_new_privs, filters = guard_marks(pid)
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, 0)  # ESRCH: gone, and the pid maybe reused
    except (OSError, ValueError):
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return no_new_privs and filters > outside_filters
