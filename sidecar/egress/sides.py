"""The egress proxy's two ends of a joined connection, as asyncio protocols: the client, whose
request head is read and handed to the proxy to decide, and the far end, counted among the
proxy's tunnels; each passes on what it reads, counting it, and pauses the other's reading
while its own write buffer is full (backpressure both ways).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sidecar.egress.heads import Refusal, Request, parse_head, refusal_bytes
from sidecar.egress.peer import Peer

if TYPE_CHECKING:
    from sidecar.egress.proxy import EgressProxy
    from sidecar.egress.pump import Pump


@dataclass(frozen=True)
class Limits:
    max_tunnels: int = 512  # far ends open (or being opened) at once; more: 503
    max_clients: int = 1024  # client connections at once; more: 503 at once
    connect_timeout: float = 10.0  # a far end that does not answer by then: 504
    idle_timeout: float = 600.0  # a connection with no byte either way for this long is closed
    head_timeout: float = 15.0  # the request head must have arrived by then: 408
    max_line: int = 8 * 1024  # the request line; longer: 414
    max_head: int = 32 * 1024  # request line and headers; longer: 431


class Side(asyncio.Protocol):
    """One end of a joined pair: what it reads goes to `peer`; while its own write buffer is
    full, the peer stops reading (backpressure both ways)."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        self.transport: asyncio.Transport | None = None
        self.peer: Side | None = None
        self.eof = False
        self.last = time.monotonic()
        self.budget: int | None = None  # bytes still to pass on (a plain request's body)
        # What a far end sent before it was joined to its client (a server that speaks first,
        # between the connect and the join): passed on at the join.
        self.early = b""
        self.moved = 0  # bytes passed on to the peer
        # What the client of a tunnel to a host with a secret sends as plain HTTP, as the far
        # end gets it (its request heads rewritten: `sidecar.egress.terminate`; TLS there is
        # served by `sidecar.egress.pump`).
        self.edit: Callable[[bytes], bytes] | None = None

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
        if self.edit is not None and data:
            data = self.edit(data)
        peer = self.peer
        if data and peer is not None and peer.transport is not None:
            peer.last = self.last
            peer.transport.write(data)
            self.moved += len(data)
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


class Upstream(Side):
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


class Client(Side):
    """A client connection: reads the request head, then is joined to the far end."""

    def __init__(self, proxy: EgressProxy) -> None:
        super().__init__(proxy)
        self.buf = b""
        self.timer: asyncio.TimerHandle | None = None
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.opened = time.monotonic()
        self.req: Request | None = None  # once its head is read
        self.rule: str | None = None  # the pattern (or approval, or policy rule) allowing it
        self.refused: str | None = None  # why it was refused
        self.peer_task: asyncio.Task[Peer | None] | None = None
        self.pump: Pump | None = None  # the thread serving it, once its TLS is terminated

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
        if self.peer is None and self.task is not None:
            # Held for an approval (read on, to see the client go away): kept for the far end.
            self.buf += data
            if len(self.buf) > self.proxy.limits.max_head and self.transport is not None:
                self.transport.pause_reading()
            return
        if self.peer is not None:
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
            self.req = req
            await self.proxy.open(self, req)
        except Refusal as refusal:
            self.refused = str(refusal)
            self.proxy.look_up(self)  # while the client still holds its end
            self.refuse(refusal.status, str(refusal), refusal.body)
        finally:
            self.task = None

    def refuse(self, status: int, reason: str, body: dict[str, object] | None = None) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(refusal_bytes(status, reason, body))
        self.close()

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pump is not None and not self.pump.over:
            self.pump.halt()  # its thread closes the connection once stopped
            return
        super().close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.proxy.clients:
            self.proxy.clients.discard(self)
            self.proxy.ended(self)
        if self.task is not None:
            self.task.cancel()  # a connect (or a wait for an approval) for a client gone away
        if self.pump is not None and not self.pump.lost.done():
            self.pump.lost.set_result(None)
        super().connection_lost(exc)
