"""The egress proxy: a forward proxy on loopback that lets the CLI reach the hosts on its
allowlist and nothing else. Plain HTTP requests in absolute form and HTTPS `CONNECT` tunnels,
decided on the host name asked for; the proxy resolves names itself; no TLS interception.

Written on asyncio protocols rather than taken from a library: proxy.py, pproxy and mitmproxy
each bring a plugin framework (or TLS interception) and several MiB of imports to a process
whose idle memory is a target, while the whole job here is one parser for the request head and
two transports joined with backpressure (each side pauses the other's reading while its write
buffer is full), which asyncio gives as it is.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.egress.allowlist import Allowlist, normalise_host
from sidecar.egress.heads import Refusal, Request, parse_head, refusal_bytes, upstream_head

log = logging.getLogger(__name__)

Denied = Callable[[str, int, str], None]  # (host, port, how)
Allowed = Callable[[str], None]  # the pattern's text


@dataclass(frozen=True)
class Limits:
    max_tunnels: int = 512  # far ends open (or being opened) at once; more: 503
    max_clients: int = 1024  # client connections at once; more: 503 at once
    connect_timeout: float = 10.0  # a far end that does not answer by then: 504
    idle_timeout: float = 600.0  # a connection with no byte either way for this long is closed
    head_timeout: float = 15.0  # the request head must have arrived by then: 408
    max_line: int = 8 * 1024  # the request line; longer: 414
    max_head: int = 32 * 1024  # request line and headers; longer: 431


class _Side(asyncio.Protocol):
    """One end of a joined pair: what it reads goes to `peer`; while its own write buffer is
    full, the peer stops reading (backpressure both ways)."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.eof = False
        self.last = time.monotonic()
        self.budget: int | None = None  # bytes still to pass on (a plain request's body)
        # What a far end sent before it was joined to its client (a server that speaks first,
        # between the connect and the join): passed on at the join.
        self.early = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        self.pass_on(data)

    def pass_on(self, data: bytes) -> None:
        if self.budget is not None:
            if data and not self.budget:
                # A second request on a kept-alive connection: the far end was asked for one
                # only. Closing makes the client send it again on a new connection, decided anew.
                self.close()
                return
            data = data[: self.budget]  # what follows the body is never sent on
            self.budget -= len(data)
        peer = self.peer
        if data and peer is not None and peer.transport is not None:
            peer.last = self.last
            peer.transport.write(data)
        elif data:
            self.early += data

    def eof_received(self) -> bool:
        self.eof = True
        peer = self.peer
        if peer is None or peer.transport is None or peer.eof:
            self.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()  # a half-close goes through (HTTP/1.0 clients use it)
        return True  # keep the other direction open

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.close()

    def close(self) -> None:
        for side in (self, self.peer):
            if side is not None and side.transport is not None:
                side.transport.close()


class _Upstream(_Side):
    """The far end: counted among the proxy's tunnels from the connect until it is gone."""

    def __init__(self, proxy: EgressProxy) -> None:
        super().__init__(proxy)
        self.counted = True
        self.one_shot = False  # plain HTTP: the far end's EOF ends the exchange
        proxy.tunnels += 1

    def release(self) -> None:
        if self.counted:
            self.counted = False
            self.proxy.tunnels -= 1

    def eof_received(self) -> bool:
        if self.one_shot:
            self.close()
            return False
        return super().eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.release()
        super().connection_lost(exc)


class _Client(_Side):
    """A client connection: reads the request head, then is joined to the far end."""

    def __init__(self, proxy: EgressProxy) -> None:
        super().__init__(proxy)
        self.buf = b""
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        proxy = self.proxy
        proxy.clients.add(self)
        if len(proxy.clients) > proxy.limits.max_clients:
            self.refuse(503, "too many connections to the egress proxy")
            return
        self.timer = proxy.loop.call_later(proxy.limits.head_timeout, self.head_late)
        proxy.arm_sweeper()

    def head_late(self) -> None:
        self.timer = None
        if self.peer is None and self.task is None:
            self.refuse(408, "the request head did not arrive in time")

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.task is not None or self.peer is not None:
            self.pass_on(data)
            return
        self.buf += data
        limits = self.proxy.limits
        end = self.buf.find(b"\r\n\r\n")
        line_end = self.buf.find(b"\r\n")
        if (line_end < 0 and len(self.buf) > limits.max_line) or line_end > limits.max_line:
            self.refuse(414, f"request line longer than {limits.max_line} bytes")
        elif (end < 0 and len(self.buf) > limits.max_head) or end > limits.max_head:
            self.refuse(431, f"request head longer than {limits.max_head} bytes")
        elif end >= 0:
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            assert self.transport is not None
            self.transport.pause_reading()  # until the far end is there
            self.task = self.proxy.loop.create_task(self.serve(head))

    async def serve(self, head: bytes) -> None:
        try:
            req = parse_head(head)
            await self.proxy.open(self, req)
        except Refusal as refusal:
            self.refuse(refusal.status, str(refusal))
        finally:
            self.task = None

    def refuse(self, status: int, reason: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(refusal_bytes(status, reason))
        self.close()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.clients.discard(self)
        if self.task is not None:
            self.task.cancel()  # a connect under way for a client that went away
        super().connection_lost(exc)


class EgressProxy:
    """The proxy for one allowlist. `also`: (host, port) pairs allowed besides the list (the
    sidecar's own API, which the CLI's hooks reach through the proxy when a client ignores
    NO_PROXY). `on_denied(host, port, "proxy")` and `on_allowed(pattern)` are told of every
    request decided."""

    def __init__(
        self,
        allow: Allowlist,
        *,
        also: tuple[tuple[str, int], ...] = (),
        on_denied: Denied | None = None,
        on_allowed: Allowed | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.allow = allow
        self.also = {(normalise_host(h), p) for h, p in also}
        self.on_denied = on_denied
        self.on_allowed = on_allowed
        self.limits = limits or Limits()
        self.tunnels = 0
        self.clients: set[_Client] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None
        return self._loop

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the proxy listens on."""
        assert self._server is not None, "the proxy is not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on `host`:`port` (0: a port the kernel picks). OSError when it cannot."""
        self._loop = asyncio.get_running_loop()
        self._server = await self._loop.create_server(
            lambda: _Client(self), host, port, reuse_address=True, backlog=1024
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for client in list(self.clients):
            client.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            await self._server.wait_closed()

    # ---- one request ---------------------------------------------------------------------

    def _decide(self, req: Request) -> str | None:
        """The pattern allowing `req` ("" for an `also` address), None when none does."""
        if (normalise_host(req.host), req.port) in self.also:
            return ""
        pattern = self.allow.match(req.host, req.port)
        return None if pattern is None else pattern.text

    async def open(self, client: _Client, req: Request) -> None:
        """Connect `client` to the far end `req` names, or raise the Refusal to answer."""
        shown = f"[{req.host}]:{req.port}" if ":" in req.host else f"{req.host}:{req.port}"
        pattern = self._decide(req)
        if pattern is None:
            if self.on_denied is not None:
                self.on_denied(req.host, req.port, "proxy")
            raise Refusal(403, f"{shown} is not on the egress allowlist (SIDECAR_EGRESS_ALLOW)")
        if self.tunnels >= self.limits.max_tunnels:
            raise Refusal(503, f"too many connections through the egress proxy ({self.tunnels})")
        if pattern and self.on_allowed is not None:
            self.on_allowed(pattern)
        upstream = _Upstream(self)
        timeout = self.limits.connect_timeout
        try:
            # The proxy resolves the name itself (getaddrinfo in the loop's executor): the
            # client's idea of the address never counts.
            await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: upstream, normalise_host(req.host) or req.host, req.port
                ),
                timeout,
            )
        except TimeoutError:
            upstream.release()
            raise Refusal(504, f"{shown} did not answer within {timeout:g} s") from None
        except socket.gaierror as exc:
            upstream.release()
            raise Refusal(502, f"cannot resolve {req.host}: {exc.strerror}") from None
        except OSError as exc:
            upstream.release()
            raise Refusal(502, f"cannot connect to {shown}: {exc.strerror or exc}") from None
        except BaseException:
            upstream.release()
            raise
        self._join(client, upstream, req)

    def _join(self, client: _Client, upstream: _Upstream, req: Request) -> None:
        assert client.transport is not None and upstream.transport is not None
        if client.transport.is_closing():
            upstream.close()
            return
        client.peer, upstream.peer = upstream, client
        if client.timer is not None:
            client.timer.cancel()
            client.timer = None
        if req.method == "CONNECT":
            client.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream.one_shot = True
            upstream.transport.write(upstream_head(req))
            client.budget = req.body
        early, client.buf = client.buf, b""
        client.pass_on(early)
        early, upstream.early = upstream.early, b""
        upstream.pass_on(early)
        client.transport.resume_reading()

    # ---- idle connections ----------------------------------------------------------------

    def arm_sweeper(self) -> None:
        if self._sweeper is None:
            delay = max(self.limits.idle_timeout / 4, 0.05)
            self._sweeper = self.loop.call_later(delay, self._sweep)

    def _sweep(self) -> None:
        """Close connections quiet both ways for the idle timeout; runs only while there are
        connections (an idle sidecar has no timer of ours)."""
        self._sweeper = None
        now = time.monotonic()
        for client in list(self.clients):
            last = max(client.last, client.peer.last if client.peer is not None else 0.0)
            if client.peer is not None and now - last > self.limits.idle_timeout:
                log.debug("egress: closing a connection idle for %.0f s", now - last)
                client.close()
        if self.clients:
            self.arm_sweeper()
