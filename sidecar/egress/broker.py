"""The connect broker: answers the guarded CLI's connect() and refused socket() calls that the
seccomp filter (sidecar.security.seccomp) sends to its listener, and reports what it refused.

A connect() address is a pointer the CLI may rewrite at any time, so the broker never lets the
kernel read it again: it copies it once (from /proc/PID/mem, checked still current with
NOTIF_ID_VALID), decides on its copy, takes the CLI's own socket with pidfd_getfd and connects
it itself. The CLI keeps its socket (options, flags, epoll registrations): a non-blocking one
gets EINPROGRESS as usual, a blocking one waits while a thread of the broker connects.
Unix sockets: the path is opened O_PATH once and connected through /proc/self/fd, so the inode
checked is the one reached. Abstract and unnamed addresses are refused (their owner is unknown).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import socket
import stat
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sidecar.security import seccomp as sf

log = logging.getLogger(__name__)

SYS_PIDFD_GETFD = 438
PIDFD_THREAD = os.O_EXCL  # a pidfd for one thread (Linux 6.9): its own fd table if unshared
AF_PACKET = 17
BLOCKING_CONNECTS = 256  # at once; more wait their turn

# Sockets that lead to a process outside the guard able to start others or to reach the
# network, wherever such a socket is usually found; the caller adds its own (tmux, ttyd).
WELL_KNOWN_DENY = (
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/dbus/system_bus_socket",
    "/run/systemd/private",
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _sockaddr_in(host: str, port: int) -> bytes:
    return (
        struct.pack("=H", socket.AF_INET)
        + struct.pack("!H", port)
        + socket.inet_aton(host)
        + bytes(8)
    )


def _sockaddr_un(path: bytes) -> bytes:
    return struct.pack("=H", socket.AF_UNIX) + path + b"\0"


def _connect(fd: int, addr: bytes) -> int:
    """connect(2) on a raw fd; 0 or the errno (EINPROGRESS for a non-blocking socket)."""
    buf = ctypes.create_string_buffer(addr, len(addr))
    if _libc.connect(fd, buf, len(addr)) == 0:
        return 0
    return ctypes.get_errno()


class Broker:
    """`allowed`: the (IPv4 address, port) pairs a connect may reach; `deny_unix`: paths of unix
    sockets it must not (looked up again on every connect: a restarted tmux server makes a new
    inode); `report`: the unix datagram socket told of every refusal, best effort."""

    def __init__(
        self,
        listener: int,
        allowed: Iterable[tuple[str, int]],
        deny_unix: Iterable[str],
        report: str | None,
    ) -> None:
        self.listener = listener
        self.allowed = frozenset(allowed)
        self.deny_unix = (*deny_unix, *WELL_KNOWN_DENY)
        self.report_path = report
        self._report = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._report.setblocking(False)
        self.uid = os.geteuid()
        # Blocking connects wait here, each on a thread (reused: a new one per connect would
        # cost more than the connect); a stalled one holds only its own thread.
        self._pool = ThreadPoolExecutor(max_workers=BLOCKING_CONNECTS, thread_name_prefix="connect")

    def handle(self, n: sf.Notification) -> None:
        """Answer one notification (every path answers it, or finds its caller gone)."""
        try:
            if n.nr == sf.SYS_CONNECT:
                self._on_connect(n)
            elif n.nr == sf.SYS_SOCKET:
                self._on_socket(n)
            else:
                sf.respond(self.listener, n.id, errno.ENOSYS)
        except OSError as exc:
            # The broker must outlive any one call: an unexpected failure refuses that call.
            log.warning("egress guard: refusing syscall %d of %d: %s", n.nr, n.pid, exc)
            with contextlib.suppress(OSError):
                sf.respond(self.listener, n.id, errno.EACCES)

    def _deny(self, n: sf.Notification, err: int, host: str, port: int, how: str) -> None:
        sf.respond(self.listener, n.id, err)
        line = json.dumps({"host": host, "port": port, "how": how}).encode() + b"\n"
        if self.report_path is not None:
            with contextlib.suppress(OSError):  # never blocks, never fails the answer
                self._report.sendto(line, self.report_path)

    def _on_socket(self, n: sf.Notification) -> None:
        """The filter passed every socket() it allows: this one is refused."""
        family, kind = n.args[0] & 0xFFFFFFFF, n.args[1] & sf.SOCK_TYPE_MASK
        if family == socket.AF_INET6:
            # EAFNOSUPPORT: programs then fall back to IPv4, which is brokered.
            self._deny(n, errno.EAFNOSUPPORT, "", 0, "ipv6")
        elif family == socket.AF_INET:
            how = "udp" if kind == socket.SOCK_DGRAM else "raw"
            self._deny(n, errno.EACCES, "", 0, how)
        elif family == AF_PACKET:
            self._deny(n, errno.EAFNOSUPPORT, "", 0, "raw")
        elif family == socket.AF_UNIX:
            sf.respond(self.listener, n.id, errno.EACCES)  # datagram: not egress, no report
        else:
            sf.respond(self.listener, n.id, errno.EAFNOSUPPORT)

    def _read_addr(self, n: sf.Notification) -> bytes | None:
        """The sockaddr the caller passed, copied once; None (answered) when unreadable."""
        ptr, size = n.args[1], min(n.args[2] & 0xFFFFFFFF, 128)
        try:
            fd = os.open(f"/proc/{n.pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            data = None
        else:
            try:
                data = os.pread(fd, size, ptr)
            except (OSError, OverflowError):
                data = None
            finally:
                os.close(fd)
        if not sf.still_valid(self.listener, n.id):
            return None  # the read may have been another process's memory: the call is gone
        if data is None or len(data) < 2:
            sf.respond(self.listener, n.id, errno.EFAULT if data is None else errno.EINVAL)
            return None
        return data

    def _on_connect(self, n: sf.Notification) -> None:
        data = self._read_addr(n)
        if data is None:
            return
        (family,) = struct.unpack_from("=H", data)
        if family == socket.AF_INET:
            if len(data) < 16:
                sf.respond(self.listener, n.id, errno.EINVAL)
                return
            port = struct.unpack_from("!H", data, 2)[0]
            host = socket.inet_ntoa(data[4:8])
            if (host, port) not in self.allowed:
                self._deny(n, errno.EACCES, host, port, "direct")
                return
            self._perform(n, _sockaddr_in(host, port))
        elif family == socket.AF_UNIX:
            self._on_unix(n, data[2:])
        elif family == socket.AF_INET6:
            self._deny(n, errno.EAFNOSUPPORT, "", 0, "ipv6")
        else:
            sf.respond(self.listener, n.id, errno.EAFNOSUPPORT)

    def _denied_inodes(self) -> set[tuple[int, int]]:
        inodes = set()
        for path in self.deny_unix:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                inodes.add((st.st_dev, st.st_ino))
        return inodes

    def _on_unix(self, n: sf.Notification, raw: bytes) -> None:
        path = raw.split(b"\0", 1)[0]
        if not raw or raw[0] == 0 or not path:
            name = "@" + raw[1:].split(b"\0", 1)[0].decode(errors="replace") if raw else ""
            self._deny(n, errno.EACCES, name, 0, "unix")
            return
        dirfd = None
        try:
            if not path.startswith(b"/"):
                # Relative to the caller's working directory, not the broker's.
                dirfd = os.open(f"/proc/{n.pid}/cwd", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            target = os.open(path, os.O_PATH | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError as exc:
            sf.respond(self.listener, n.id, exc.errno or errno.ENOENT)
            return
        finally:
            if dirfd is not None:
                os.close(dirfd)
        st = os.fstat(target)
        if not stat.S_ISSOCK(st.st_mode):
            os.close(target)
            sf.respond(self.listener, n.id, errno.ECONNREFUSED)
        elif st.st_uid != self.uid or (st.st_dev, st.st_ino) in self._denied_inodes():
            # Another user's socket, or one of a process outside the guard (tmux, ttyd).
            os.close(target)
            self._deny(n, errno.EACCES, path.decode(errors="replace"), 0, "unix")
        else:
            self._perform(n, _sockaddr_un(f"/proc/self/fd/{target}".encode()), keep=target)

    def _perform(self, n: sf.Notification, addr: bytes, keep: int | None = None) -> None:
        """Connect the caller's own socket to `addr` (the broker's copy) and answer with what
        connect returned. `keep`: an fd `addr` names; closed here once the connect is made."""
        sock = self._their_socket(n)
        if sock is None:
            if keep is not None:
                os.close(keep)
            return
        if os.get_blocking(sock):
            self._pool.submit(self._connect_blocking, n.id, sock, addr, keep)
            return
        try:
            sf.respond(self.listener, n.id, _connect(sock, addr))
        finally:
            os.close(sock)
            if keep is not None:
                os.close(keep)

    def _their_socket(self, n: sf.Notification) -> int | None:
        """The caller's fd args[0], taken into the broker; None (answered if still waiting)."""
        pidfd = self._pidfd(n.pid)
        if pidfd is None or not sf.still_valid(self.listener, n.id):
            if pidfd is not None:
                os.close(pidfd)
            return None
        try:
            sock = int(
                _libc.syscall(
                    ctypes.c_long(SYS_PIDFD_GETFD),
                    ctypes.c_int(pidfd),
                    ctypes.c_int(n.args[0] & 0xFFFFFFFF),
                    ctypes.c_uint(0),
                )
            )
            err = ctypes.get_errno()
        finally:
            os.close(pidfd)
        if sock < 0 and err in (errno.EPERM, errno.ENOSYS):
            return self._new_socket(n)  # pidfd_getfd refused here (Docker's default seccomp)
        if sock < 0:
            sf.respond(self.listener, n.id, errno.EBADF if err == errno.EBADF else errno.EACCES)
            return None
        return sock

    def _new_socket(self, n: sf.Notification) -> int | None:
        """Where the broker may not take the caller's socket: a new one of the broker's, put
        in its place (SECCOMP_IOCTL_NOTIF_ADDFD) with the same blocking and close-on-exec
        flags, to be connected by the broker. Options set on the old one before connect are
        lost (none of the CLIs' clients needs one to connect). None: answered."""
        target = n.args[0] & 0xFFFFFFFF
        try:
            flags = _fd_flags(n.pid, target)
            family = socket.AF_UNIX if _is_unix(n.pid, target) else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            sf.respond(self.listener, n.id, errno.EBADF)
            return None
        fd = sock.detach()
        try:
            os.set_blocking(fd, not flags & os.O_NONBLOCK)
            sf.add_fd(self.listener, n.id, fd, target, flags & os.O_CLOEXEC)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                sf.respond(self.listener, n.id, errno.EACCES)
            return None
        return fd  # the broker's copy: the caller holds the same socket at `target`

    def _connect_blocking(self, nid: int, sock: int, addr: bytes, keep: int | None) -> None:
        try:
            sf.respond(self.listener, nid, _connect(sock, addr))
        except OSError as exc:
            log.warning("egress guard: answering a connect: %s", exc)
        finally:
            os.close(sock)
            if keep is not None:
                os.close(keep)

    @staticmethod
    def _pidfd(tid: int) -> int | None:
        try:
            return os.pidfd_open(tid, PIDFD_THREAD)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                return None
        # Before Linux 6.9: the process's pidfd (its threads share one fd table but for
        # unshare(CLONE_FILES), where the process's socket of that number is connected).
        try:
            return os.pidfd_open(_tgid(tid))
        except (OSError, ValueError):
            return None


def _tgid(tid: int) -> int:
    for line in Path(f"/proc/{tid}/status").read_text().splitlines():
        if line.startswith("Tgid:"):
            return int(line.split()[1])
    msg = f"no Tgid for {tid}"
    raise ValueError(msg)


def _fd_flags(pid: int, fd: int) -> int:
    """The file status flags of `pid`'s `fd` (octal `flags:` in /proc/PID/fdinfo)."""
    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8)
    return 0


def _is_unix(pid: int, fd: int) -> bool:
    """Whether `pid`'s `fd` is a unix socket (its inode listed in /proc/PID/net/unix)."""
    link = os.readlink(f"/proc/{pid}/fd/{fd}")  # socket:[INODE]
    inode = link.removeprefix("socket:[").removesuffix("]")
    with open(f"/proc/{pid}/net/unix") as table:  # Num RefCount Protocol Flags Type St Inode
        return any(line.split()[6:7] == [inode] for line in table)
