"""A terminated TLS connection served by a thread of its own: both handshakes, then the bytes
both ways over nonblocking sockets (`Channel`: OpenSSL's memory buffers), each request head
through the `Editor`. The ssl module releases the GIL while OpenSSL decrypts and encrypts: the
bytes move in C, not through asyncio's TLS protocol and its event loop turns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

from sidecar.egress.channel import CHUNK, Channel
from sidecar.egress.heads import refusal_bytes

if TYPE_CHECKING:
    from sidecar.egress.sides import Client, Side, Upstream
    from sidecar.egress.terminate import Editor

log = logging.getLogger(__name__)


class Way:
    """One direction: what `src` sends, read into `buf` and written to `dst` (whose records
    not yet sent hold the reading back); `wait`, the socket and the poll event it waits for."""

    def __init__(self, src: Channel, dst: Channel | None, side: Side) -> None:
        self.src, self.dst, self.side = src, dst, side
        self.buf = memoryview(bytearray(CHUNK))
        self.eof = False
        self.wait: tuple[int, int] | None = (src.fileno(), select.POLLIN)  # None: at its end


class Pump:
    """The client's and the far end's sockets (duplicates: their asyncio transports stay open,
    paused, and are closed when this ends), moved by one thread until either side closes or
    `halt` (the proxy closing the connection) stops it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, client: Client, upstream: Upstream,
                 host: str, shown: str) -> None:  # fmt: skip
        self.loop, self.client, self.upstream = loop, client, upstream
        self.host, self.shown = host, shown
        self.halted = False  # the proxy closed the connection
        self.over = False  # the thread has stopped
        self.lost: asyncio.Future[None] = loop.create_future()  # the client's connection_lost
        self.done = False  # the editor ended it (a request refused)
        assert client.transport is not None and upstream.transport is not None
        self.ends = [t.get_extra_info("socket") for t in (client.transport, upstream.transport)]
        far = None  # the far end closed before its TLS could start
        if not upstream.transport.is_closing():
            upstream.transport.pause_reading()  # the thread reads it now
            far = self.ends[1].dup()
        self.socks: list[socket.socket | None] = [self.ends[0].dup(), far]
        self.near: Channel | None = None  # the client's TLS, once up

    def start(self, client_ctx: ssl.SSLContext, upstream_ctx: ssl.SSLContext,
              editor: Editor) -> None:  # fmt: skip
        thread = threading.Thread(
            target=self._run, args=(client_ctx, upstream_ctx, editor), name="egress-tls",
            daemon=True,
        )  # fmt: skip
        thread.start()

    def halt(self) -> None:
        """From the event loop: stop the thread (its sockets shut: a wait or a handshake in it
        returns at once)."""
        self.halted = True
        for end in self.ends:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def _run(self, client_ctx: ssl.SSLContext, upstream_ctx: ssl.SSLContext,
             editor: Editor) -> None:  # fmt: skip
        try:
            far = self._upstream_tls(upstream_ctx, editor)
            near = None if self.halted else self._client_tls(client_ctx)
            if near is not None:
                editor.answer, editor.end = self._refuse, self._end
                ways = [Way(near, far, self.client)]
                if far is not None:
                    ways.append(Way(far, near, self.upstream))
                self._pump(ways, editor)
        except OSError as exc:  # a side reset or shut (halt): the connection is over
            log.debug("egress: %s: %s", self.shown, exc)
        except Exception:
            log.exception("egress: the thread serving %s failed", self.shown)
        finally:
            for sock in self.socks:
                if sock is not None:
                    sock.close()
            with contextlib.suppress(RuntimeError):  # the loop is closed: so is everything
                self.loop.call_soon_threadsafe(self._over)

    def _over(self) -> None:
        """In the event loop, the thread stopped: the connection's transports closed (its
        record, its count)."""
        self.over = True
        self.client.close()

    def _upstream_tls(self, context: ssl.SSLContext, editor: Editor) -> Channel | None:
        """TLS with the far end, first; None when it failed (`editor.failed` says why, to be
        told to the client once its TLS is up), the far end's side then closed."""
        raw = self.socks[1]
        try:
            if raw is None:
                msg = "the connection closed"
                raise ConnectionError(msg)
            far = Channel(raw, context, server_side=False, host=self.host)
            far.handshake(self.client.proxy.limits.connect_timeout)
        except ssl.SSLCertVerificationError as exc:
            editor.failed = (
                f"the certificate of {self.shown} is not valid: {exc.verify_message}; not sent on"
            )
        except OSError as exc:
            editor.failed = f"TLS with {self.shown} failed: {exc or type(exc).__name__}"
        else:
            return far
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.upstream.close)
        return None

    def _client_tls(self, context: ssl.SSLContext) -> Channel | None:
        """TLS with the client, the sleeve CA's certificate for the host; None when it failed
        (said in the client's record)."""
        raw = self.socks[0]
        assert raw is not None
        near = Channel(raw, context, server_side=True)
        try:
            near.handshake(self.client.proxy.limits.head_timeout)
        except OSError as exc:
            # The client refused the sleeve's certificate (it does not trust the CA), or left
            # (or the proxy closed: its shut socket may be how the refusal was seen).
            refused = f"TLS with the client failed (does it trust the sleeve's CA?): {exc}"
            self.client.refused = refused
            log.info("egress: %s: %s", self.shown, refused)
            return None
        self.near = near
        return near

    def _refuse(self, status: int, reason: str) -> None:
        """The first request refused: answered over the client's TLS, then the end."""
        near = self.near
        assert near is not None
        near.sock.settimeout(self.client.proxy.limits.head_timeout)
        with contextlib.suppress(OSError):
            near.write(refusal_bytes(status, reason))
        near.sock.setblocking(False)  # the close_notify that follows waits for nothing
        self._end()

    def _end(self) -> None:
        self.done = True

    def _pump(self, ways: list[Way], editor: Editor) -> None:
        poll = select.poll()
        ready: set[int] | None = None  # the first turn tries every way
        while not (self.halted or self.done):
            for way in ways:
                if ready is None or (way.wait is not None and way.wait[0] in ready):
                    self._move(way, editor)
            held = any(way.dst is not None and way.dst.pending for way in ways)
            if any(way.eof for way in ways) and not held:
                break  # TLS has no half-close: the first end ends both, once flushed
            wants: dict[int, int] = {}
            for way in ways:
                if way.wait is not None:
                    fd, event = way.wait
                    wants[fd] = wants.get(fd, 0) | event
            for fd, mask in wants.items():
                poll.register(fd, mask)
            ready = {fd for fd, _ in poll.poll()}
            for fd in wants:
                poll.unregister(fd)
        if not self.halted:
            for way in ways:
                with contextlib.suppress(OSError):
                    way.src.close_notify()

    def _move(self, way: Way, editor: Editor) -> None:
        """Send on what `way` holds, then read and send on until either side would wait."""
        src, dst = way.src, way.dst
        src.drained = False  # woken for it: the socket may have more
        while not (self.halted or self.done):
            if dst is not None and dst.pending and not dst.flush():
                way.wait = (dst.fileno(), select.POLLOUT)
                return
            if way.eof:
                way.wait = None  # (its socket, readable at its end, would wake the wait at once)
                return
            way.wait = (src.fileno(), select.POLLIN)
            read = self._read(way)
            if not read:
                return
            way.side.last = time.monotonic()
            data = editor(bytes(way.buf[:read])) if way.side is self.client else way.buf[:read]
            if data and dst is not None:
                dst.write(data)
                way.side.moved += len(data)

    @staticmethod
    def _read(way: Way) -> int:
        """What `way.src` has now, up to CHUNK (several TLS records)."""
        read = 0
        while read < CHUNK:
            got = way.src.read_into(way.buf[read:])
            if got is None:
                break
            if not got:
                way.eof = True
                break
            read += got
        return read
