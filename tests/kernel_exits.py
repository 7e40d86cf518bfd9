"""The kernel's own record of process exits (the netlink process connector, CN_PROC): the
witness for the order in which processes ended, where a poller would see only the order in which
it happened to look."""

from __future__ import annotations

import errno
import socket
import struct
import threading
from types import TracebackType

# The kernel's process connector (netlink, CN_PROC): exit events with kernel timestamps.
NETLINK_CONNECTOR, CN_IDX_PROC, CN_VAL_PROC = 11, 1, 1
PROC_CN_MCAST_LISTEN, PROC_EVENT_EXIT, NLMSG_DONE = 1, 0x80000000, 3
SO_RCVBUFFORCE = 33
NLMSG_HDR, CN_MSG_HDR = struct.Struct("=IHHII"), struct.Struct("=IIIIHH")
EVENT_HDR, EXIT_DATA = struct.Struct("=IIQ"), struct.Struct("=IIII")


class KernelExits:
    """Every thread exit on the machine as the kernel reports it (needs root): for each, the
    thread id, its process id, the wait status and the kernel's timestamp, so the order in
    which processes ended is the kernel's, not whatever order a poller happened to notice."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        self.sock.bind((0, CN_IDX_PROC))
        self.sock.settimeout(0.1)
        op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
        cn = CN_MSG_HDR.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0) + op
        self.sock.send(NLMSG_HDR.pack(NLMSG_HDR.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn)
        self.events: list[tuple[int, int, int, int]] = []  # (timestamp_ns, tid, pid, status)
        self.lost = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        offset = NLMSG_HDR.size + CN_MSG_HDR.size
        while not self._done.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue  # the wake-up to look at _done
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    self.lost = True
                    continue
                raise
            what, _cpu, stamp = EVENT_HDR.unpack_from(data, offset)
            if what == PROC_EVENT_EXIT:
                tid, pid, status, _ = EXIT_DATA.unpack_from(data, offset + EVENT_HDR.size)
                self.events.append((stamp, tid, pid, status))

    def of(self, pid: int) -> list[tuple[int, int, int, int]]:
        return [e for e in list(self.events) if e[2] == pid]

    def __enter__(self) -> KernelExits:
        return self

    def __exit__(
        self, t: type[BaseException] | None, v: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join(5)
        self.sock.close()
