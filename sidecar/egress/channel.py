"""TLS over a socket through OpenSSL's memory buffers, for the thread that serves a terminated
connection (`sidecar.egress.pump`): a read takes all the socket holds in one syscall and a
write sends its records together (OpenSSL on the socket itself makes two reads a record and a
write each: ~180 syscalls a MB, more CPU than the copies this costs).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from typing import cast

CHUNK = 64 * 1024  # what one read from the socket takes at most (and a way's buffer)


class Channel:
    """One side's TLS: `sock` (blocking with a timeout for the handshake, nonblocking after),
    and the records not yet sent (`pending`)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, *, server_side: bool,
                 host: str | None = None) -> None:  # fmt: skip
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(
            self.incoming, self.outgoing, server_side=server_side, server_hostname=host
        )
        self.pending: bytes | memoryview = b""
        self.drained = False  # the last read from the socket took all it had

    def fileno(self) -> int:
        return self.sock.fileno()

    def handshake(self, timeout: float) -> None:
        """OSError (SSLError, TimeoutError) when it fails or takes longer than `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._send_all(deadline)
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = self.sock.recv(CHUNK)
                if not data:
                    msg = "the connection closed during the TLS handshake"
                    raise ConnectionError(msg) from None
                self.incoming.write(data)
        self._send_all(deadline)
        self.sock.setblocking(False)

    def _send_all(self, deadline: float) -> None:
        data = self.outgoing.read()
        if data:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            self.sock.sendall(data)

    def read_into(self, buf: memoryview) -> int | None:
        """Plaintext into `buf`: how much; 0 at the end (the peer's close_notify, or the
        connection closed); None when nothing has come yet."""
        while True:
            try:
                return cast(int, self.tls.read(len(buf), buf))  # with a buffer: a count
            except ssl.SSLWantReadError:
                if self.drained:
                    return None  # the socket was empty a moment ago: wait for it
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                return 0
            try:
                data = self.sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                self.drained = True
                return None
            self.drained = len(data) < CHUNK
            if data:
                self.incoming.write(data)
            else:
                self.incoming.write_eof()

    def write(self, data: bytes | memoryview) -> bool:
        """`data` encrypted and sent, as much as the socket takes now: whether all went."""
        self.tls.write(data)
        return self.flush()

    def flush(self) -> bool:
        """Send what is pending (the records written, and any OpenSSL made while reading: a
        key update's): whether all went."""
        if self.outgoing.pending:
            more = self.outgoing.read()
            self.pending = bytes(self.pending) + more if self.pending else more
        while self.pending:
            try:
                sent = self.sock.send(self.pending)
            except (BlockingIOError, InterruptedError):
                return False
            self.pending = memoryview(self.pending)[sent:]
        return True

    def close_notify(self) -> None:
        """The TLS end sent, if the socket takes it now (the peer's is not waited for)."""
        with contextlib.suppress(ssl.SSLError):
            self.tls.unwrap()
        self.flush()
