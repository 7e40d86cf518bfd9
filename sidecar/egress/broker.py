"""The connect broker: answers the guarded CLI's connect() and refused socket() calls that the
seccomp filter (sidecar.security.seccomp) sends to its listener, and reports what it refused.

A connect() address is a pointer the CLI may rewrite at any time, so the broker never lets the
kernel read it again: it copies it once (from /proc/PID/mem, checked still current with
NOTIF_ID_VALID), decides on its copy, takes the CLI's own socket with pidfd_getfd and connects
it itself. The CLI keeps its socket (options, flags, epoll registrations): a non-blocking one
gets EINPROGRESS as usual, a blocking one waits while a thread of the broker connects.
Unix sockets are decided by what they are, not by a path (a rename, a hard link or a
/proc/PID/fd path all reach the same socket): the path is opened O_PATH once, a socket of the
broker's own connects through /proc/self/fd to that very inode, and only if the process that
listens there is itself inside a guard does the CLI get the connected socket (put in its place).
A process outside (tmux, ttyd, a daemon of the host) never sees a byte from the CLI. Abstract
and unnamed addresses are refused (their owner is unknown).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import socket
import stat
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from sidecar.egress import callers
from sidecar.egress.reports import report_line
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
        # The filters every process outside the guard has here (the runtime's, if any): one
        # more, ours, marks a process inside. Read before the broker adds its own.
        self.outside_filters = callers.guard_marks(os.getpid())[1]
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
        line = report_line(host, port, how)
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
            self._perform(n, callers.sockaddr_in(host, port))
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
        shown = path.decode(errors="replace")
        try:
            st = os.fstat(target)
            theirs = None
            if not stat.S_ISSOCK(st.st_mode):
                sf.respond(self.listener, n.id, errno.ECONNREFUSED)
            elif st.st_uid != self.uid or (st.st_dev, st.st_ino) in self._denied_inodes():
                # Another user's socket, or one of a process outside the guard (tmux, ttyd).
                self._deny(n, errno.EACCES, shown, 0, "unix")
            else:
                theirs = self._their_unix(n)
        except BaseException:
            os.close(target)
            raise
        if theirs is None:
            os.close(target)
        elif theirs[1] & os.O_NONBLOCK:
            self._connect_unix(n, target, theirs, shown)
        else:
            self._pool.submit(self._connect_unix, n, target, theirs, shown)

    def _their_unix(self, n: sf.Notification) -> tuple[int, int] | None:
        """The type and file flags of the caller's unix socket args[0]; None (answered) when it
        is not an unconnected unix stream or seqpacket socket of the caller's."""
        fd = n.args[0] & 0xFFFFFFFF
        try:
            row = callers.unix_row(n.pid, fd)
            flags = callers.fd_flags(n.pid, fd)
        except (OSError, ValueError):
            row, flags = None, 0
        if not sf.still_valid(self.listener, n.id):
            return None  # what was read may be another process's
        kind = callers.UNIX_TYPES.get(int(row[4], 16)) if row is not None else None
        if row is None or kind is None:
            sf.respond(self.listener, n.id, errno.ENOTSOCK if row is None else errno.EPROTOTYPE)
            return None
        if row[5] == callers.UNIX_CONNECTED:
            sf.respond(self.listener, n.id, errno.EISCONN)
            return None
        return kind, flags

    def _connect_unix(
        self, n: sf.Notification, target: int, theirs: tuple[int, int], shown: str
    ) -> None:
        """Connect a socket of the broker's own, of the caller's type, to `target` (an O_PATH
        fd, closed here), and put it in the caller's place (its file flags kept) if the
        process listening there is inside a guard. A blocking caller's runs on a thread."""
        kind, flags = theirs
        try:
            with socket.socket(socket.AF_UNIX, kind) as sock:
                sock.setblocking(not flags & os.O_NONBLOCK)
                err = callers.connect(
                    sock.fileno(), callers.sockaddr_un(f"/proc/self/fd/{target}".encode())
                )
                if err:
                    sf.respond(self.listener, n.id, err)
                elif not callers.listener_inside(sock, self.outside_filters):
                    self._deny(n, errno.EACCES, shown, 0, "unix")
                else:
                    into = n.args[0] & 0xFFFFFFFF
                    sf.add_fd(self.listener, n.id, sock.fileno(), into, flags & os.O_CLOEXEC)
                    sf.respond(self.listener, n.id, 0)
        except OSError as exc:
            log.warning("egress guard: a unix connect of %d: %s", n.pid, exc)
            with contextlib.suppress(OSError):
                sf.respond(self.listener, n.id, errno.EACCES)
        finally:
            os.close(target)

    def _perform(self, n: sf.Notification, addr: bytes) -> None:
        """Connect the caller's own socket to `addr` (the broker's copy) and answer with what
        connect returned."""
        sock = self._their_socket(n)
        if sock is None:
            return
        if os.get_blocking(sock):
            self._pool.submit(self._connect_blocking, n.id, sock, addr)
            return
        try:
            sf.respond(self.listener, n.id, callers.connect(sock, addr))
        finally:
            os.close(sock)

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
            flags = callers.fd_flags(n.pid, target)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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

    def _connect_blocking(self, nid: int, sock: int, addr: bytes) -> None:
        try:
            sf.respond(self.listener, nid, callers.connect(sock, addr))
        except OSError as exc:
            log.warning("egress guard: answering a connect: %s", exc)
        finally:
            os.close(sock)

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
            return os.pidfd_open(callers.tgid(tid))
        except (OSError, ValueError):
            return None
