"""Which process is on the other end of a loopback TCP connection, as the kernel tells it: the
socket whose local address is the client's and whose remote address is ours is looked up through
sock_diag, which gives its inode and uid; the process holding that inode is found among
/proc/*/fd. Never the client's say-so. Blocking: run it in a worker thread, acting as the
CLI's user (the kernel shows a process's descriptors only to its own user, or to a tracer).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

MAX_ARGV = 4096  # bytes of a command line kept
MAX_PROCS = 4096  # processes looked through at most


@dataclass(frozen=True)
class Peer:
    uid: int | None
    pid: int | None = None
    exe: str | None = None
    argv: tuple[str, ...] = ()


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
_NOCOOKIE = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
# inet_diag_req_v2: family, protocol, ext, pad, states; then inet_diag_sockid: sport, dport
# (big-endian), src[16], dst[16], interface, cookie[2].
_REQUEST = struct.Struct("=BBBxI")
_PORTS = struct.Struct(">HH")
_ENDS = struct.Struct("=16s16sIII")
# inet_diag_msg: family, state, timer, retrans, the sockid (48 bytes), expires, rqueue, wqueue,
# uid, inode.
_ANSWER = struct.Struct("=BBBB48sIIIII")


def _packed(host: str) -> tuple[int, bytes]:
    address = ipaddress.ip_address(host)
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    return family, address.packed.ljust(16, b"\0")


def _request(client: tuple[str, int], server: tuple[str, int]) -> bytes:
    """The sock_diag request for exactly the client's end of `client` -> `server`."""
    family, src = _packed(client[0])
    _, dst = _packed(server[0])
    body = (
        _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF)
        + _PORTS.pack(client[1], server[1])
        + _ENDS.pack(src, dst, 0, _NOCOOKIE, _NOCOOKIE)
    )
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body


def _answer(answer: bytes) -> tuple[int, int] | None:
    """(inode, uid) from a sock_diag answer; None for an error (no such socket) or a socket
    no process holds any more (inode 0: closed, in TIME_WAIT)."""
    if len(answer) < _HEADER.size + _ANSWER.size:
        return None
    _, kind, _, _, _ = _HEADER.unpack_from(answer)
    if kind != SOCK_DIAG_BY_FAMILY:
        return None  # NLMSG_ERROR
    fields = _ANSWER.unpack_from(answer, _HEADER.size)
    inode, uid = fields[9], fields[8]
    return (inode, uid) if inode else None


def _holds(pid: int, wanted: str) -> bool:
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False  # gone, or not ours to look into
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"{fd_dir}/{fd}") == wanted:
                return True
    return False


def _holder(inode: int, hint: int | None) -> int | None:
    """The pid of a process with a descriptor on socket `inode`, not this process: `hint`
    first (the last holder found is the likeliest: a CLI's requests come from few processes),
    then every process."""
    wanted = f"socket:[{inode}]"
    me = os.getpid()
    if hint is not None and hint != me and _holds(hint, wanted):
        return hint
    try:
        pids = [int(e) for e in os.listdir("/proc") if e.isdigit()][:MAX_PROCS]
    except OSError:
        return None
    return next((pid for pid in pids if pid not in (me, hint) and _holds(pid, wanted)), None)


class PeerFinder:
    """Finds peers from one thread: its sock_diag socket stays open between lookups, for the
    supervisor's life (what `ss` uses: one exact lookup costs microseconds where reading
    /proc/net/tcp costs a line per socket in the namespace), and it remembers the last pid
    found (a CLI's requests come from few processes)."""

    def __init__(self) -> None:
        self._hint: int | None = None
        self._nl: socket.socket | None = None

    def _socket(self, client: tuple[str, int], server: tuple[str, int]) -> tuple[int, int] | None:
        """(inode, uid) of the client's end of the connection from `client` to `server`."""
        try:
            if self._nl is None:
                self._nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
                self._nl.settimeout(1.0)
            self._nl.sendto(_request(client, server), (0, 0))
            return _answer(self._nl.recv(8192))
        except OSError:
            if self._nl is not None:  # made again next time
                self._nl.close()
                self._nl = None
            return None

    def find(
        self, client: tuple[str, int], server: tuple[str, int], *, argv: bool = False
    ) -> Peer | None:
        """The process behind the connection (`argv`: its command line too); None when the
        client's end is gone already."""
        found = self._socket(client, server)
        if found is None:
            return None
        inode, uid = found
        pid = _holder(inode, self._hint)
        if pid is None:
            return Peer(uid)
        self._hint = pid
        exe = line = None
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe")
        if argv:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as fh:
                line = fh.read(MAX_ARGV)
        args = tuple(a.decode("utf-8", "replace") for a in (line or b"").split(b"\0")[:-1])
        return Peer(uid, pid, exe, args)
