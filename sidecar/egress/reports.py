"""The report channel: the connect broker tells the supervisor of every refusal, one JSON
datagram each on a unix socket in the state dir (`Layout.egress_reports`).

Only the broker's own reports count: the receiver takes the sender's credentials from the
kernel (SO_PASSCRED: a process can give no pid or uid but its own) and drops a datagram from
any other process, and every field is checked against the `egress-denied` event it becomes.
The socket is the sidecar's, in a directory the guarded CLI can change nothing in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable, Collection
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DATAGRAM = 1024  # a report is far below it; anything longer is not one
MAX_HOST = 255
_CREDS = struct.Struct("=iII")  # struct ucred: pid, uid, gid


def report_line(host: str, port: int, how: str) -> bytes:
    """What the broker sends for one refusal."""
    return json.dumps({"host": host, "port": port, "how": how}).encode() + b"\n"


def parse_report(data: bytes, hows: Collection[str]) -> tuple[str, int, str] | None:
    """(host, port, how) of a well-formed report; None for anything else. Pure."""
    try:
        line = json.loads(data)
        host, port, how = line["host"], line["port"], line["how"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(host, str) and len(host) <= MAX_HOST and host.isprintable()):
        return None
    if type(port) is not int or not 0 <= port <= 65535 or how not in hows:
        return None
    return host, port, how


class ReportListener:
    """The supervisor's end: `on_denied(host, port, how)` per report that `sender(pid, uid)`
    accepts (the broker beside the running CLI) and that names an `how` of `hows`."""

    def __init__(
        self,
        sock: socket.socket,
        on_denied: Callable[[str, int, str], None],
        sender: Callable[[int, int], bool],
        hows: Collection[str],
    ) -> None:
        self.sock = sock
        self.on_denied = on_denied
        self.sender = sender
        self.hows = frozenset(hows)
        self.dropped = 0  # datagrams from anyone else, or malformed

    @classmethod
    def open(
        cls,
        path: Path,
        on_denied: Callable[[str, int, str], None],
        *,
        sender: Callable[[int, int], bool],
        hows: Collection[str],
        group: int | None = None,
    ) -> ReportListener:
        """Bind `path` (a stale one is replaced) as the sidecar itself; `group`: the CLI
        user's group, whose broker may then send (0660), else only the sidecar's uid (0600)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            sock.bind(str(path))
            if group is not None:
                os.chown(path, -1, group)
            os.chmod(path, 0o660 if group is not None else 0o600)
        except OSError:
            sock.close()
            raise
        listener = cls(sock, on_denied, sender, hows)
        asyncio.get_running_loop().add_reader(sock.fileno(), listener.read)
        return listener

    def read(self) -> None:
        """Every datagram waiting (the loop calls it when the socket is readable)."""
        space = socket.CMSG_SPACE(_CREDS.size)
        while True:
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(MAX_DATAGRAM, space)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("egress reports: %s", exc)
                return
            self.take(data, ancillary)

    def take(self, data: bytes, ancillary: list[tuple[int, int, bytes]]) -> None:
        creds = next(
            (
                _CREDS.unpack(payload[: _CREDS.size])
                for level, kind, payload in ancillary
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
            ),
            None,
        )
        report = parse_report(data, self.hows)
        if creds is None or report is None or not self.sender(creds[0], creds[1]):
            self.dropped += 1
            return
        self.on_denied(*report)

    def close(self) -> None:
        with contextlib.suppress(ValueError, RuntimeError):  # a closed loop or socket
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
