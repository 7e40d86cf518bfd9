"""The egress proxy: a forward proxy on loopback that lets the CLI reach the hosts on its
allowlist and nothing else. Plain HTTP requests in absolute form and HTTPS `CONNECT` tunnels,
decided on the host name asked for; the proxy resolves names itself. TLS is terminated only for
the hosts that have a secret (`sidecar.egress.terminate`); every other CONNECT is a blind tunnel.

Written on asyncio protocols rather than taken from a library: proxy.py, pproxy and mitmproxy
each bring a plugin framework (or TLS interception) and several MiB of imports to a process
whose idle memory is a target, while the whole job here is one parser for the request head and
two transports joined with backpressure (each side pauses the other's reading while its write
buffer is full), which asyncio gives as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from sidecar.audit.records import EgressConnectionRecord
from sidecar.egress.allowlist import Allowlist, normalise_host
from sidecar.egress.heads import Refusal, Request, upstream_head
from sidecar.egress.peer import Peer
from sidecar.egress.sides import Client, Limits, Upstream
from sidecar.egress.terminate import Termination, terminate

log = logging.getLogger(__name__)

Denied = Callable[[str, int, str], None]  # (host, port, how)
Allowed = Callable[[str], None]  # the pattern's text
Closed = Callable[[EgressConnectionRecord], None]  # a request's connection ended (or was refused)
# (client address, proxy address, with its command line): the process behind a connection.
FindPeer = Callable[[tuple[str, int], tuple[str, int], bool], Awaitable[Peer | None]]
# A request head (request line and header lines, through the blank line) in, the same head with
# each secret's placeholder replaced by its real value out.
Rewrite = Callable[[bytes], bytes]
# The normalised host a request asks for -> its rewrite, or None: no secret goes to that host.
Secrets = Callable[[str], Rewrite | None]
# (normalised host, request head): a plain HTTP head going out unchanged (no secret goes to the
# host), to count the placeholders it carries.
Unlisted = Callable[[str, bytes], None]
ALSO = "also"  # the rule of a connection to an address allowed besides the list (the API)
NEXT = (
    "This sleeve reaches only the hosts on its egress allowlist. If the task needs this host, "
    "say so: a person can allow it (PATCH /egress, or by answering its approval) and you can "
    "try again."
)


@dataclass(frozen=True)
class Asked:
    """A request for a host off the list, held while it is decided (`SIDECAR_EGRESS_ASK`)."""

    host: str
    port: int
    method: str
    summary: str  # `CONNECT host:port`, `GET http://host/path`
    peer: Callable[[], Awaitable[Peer | None]]  # the process that asked, as the kernel tells it


@dataclass(frozen=True)
class AskAnswer:
    allowed: bool
    rule: str | None = None  # what allowed it (`approval:<id>`, `policy:<rule>`)
    reason: str = ""  # why it was refused, told to the agent


Ask = Callable[[Asked], Awaitable[AskAnswer]]


class EgressProxy:
    """The proxy for one allowlist (`allow`, which may change while it runs). `also`: (host,
    port) pairs allowed besides the list (the sidecar's own API, which the CLI's hooks reach
    through the proxy when a client ignores NO_PROXY). `on_denied(host, port, "proxy")` and
    `on_allowed(pattern)` are told of every request decided; `ask`, when set, decides a request
    for a host off the list while it is held; `on_closed` gets each request's record when its
    connection ends, with the process that made it (`find_peer`); `secrets`, when set, names
    the hosts whose requests carry a secret's real value in place of its placeholder (a CONNECT
    to one is TLS terminated with `termination`'s CA; every other stays a blind tunnel), and
    `unlisted` sees the plain HTTP heads to every other host."""

    def __init__(
        self,
        allow: Allowlist,
        *,
        also: tuple[tuple[str, int], ...] = (),
        on_denied: Denied | None = None,
        on_allowed: Allowed | None = None,
        limits: Limits | None = None,
        ask: Ask | None = None,
        on_closed: Closed | None = None,
        find_peer: FindPeer | None = None,
        secrets: Secrets | None = None,
        unlisted: Unlisted | None = None,
        termination: Termination | None = None,
    ) -> None:
        self.allow = allow
        self.also = {(normalise_host(h), p) for h, p in also}
        self.on_denied = on_denied
        self.on_allowed = on_allowed
        self.ask = ask
        self.on_closed = on_closed
        self.find_peer = find_peer
        self.secrets = secrets
        self.unlisted = unlisted
        self.termination = termination
        self.limits = limits or Limits()
        self.tunnels = 0
        self.clients: set[Client] = set()
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
            lambda: Client(self), host, port, reuse_address=True, backlog=1024
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        pumped = [client.pump.lost for client in self.clients if client.pump is not None]
        for client in list(self.clients):
            client.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            await self._server.wait_closed()
        if pumped:
            # A terminated connection ends once its thread has stopped (at once: its sockets
            # are shut), in a later turn of the loop: awaited, so that it is recorded by now.
            await asyncio.wait(pumped, timeout=1.0)

    # ---- one request ---------------------------------------------------------------------

    def _decide(self, req: Request) -> str | None:
        """The pattern allowing `req` ("" for an `also` address), None when none does."""
        if (normalise_host(req.host), req.port) in self.also:
            return ""
        pattern = self.allow.match(req.host, req.port)
        return None if pattern is None else pattern.text

    async def open(self, client: Client, req: Request) -> None:
        """Connect `client` to the far end `req` names, or raise the Refusal to answer."""
        shown = f"[{req.host}]:{req.port}" if ":" in req.host else f"{req.host}:{req.port}"
        pattern = self._decide(req)
        if pattern is None:
            client.rule = await self._asked(client, req, shown)
        else:
            client.rule = pattern or ALSO
            if pattern and self.on_allowed is not None:
                self.on_allowed(pattern)
        if self.tunnels >= self.limits.max_tunnels:
            raise Refusal(503, f"too many connections through the egress proxy ({self.tunnels})")
        upstream = Upstream(self)
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
        if req.method == "CONNECT" and self.secrets is not None:
            rewrite = self.secrets(normalise_host(req.host) or req.host)
            if rewrite is not None:
                await terminate(self, client, upstream, req, rewrite)
                return
        self._join(client, upstream, req)
        if self.on_closed is not None:
            # Who asked is looked up once the tunnel is up: never on the connection's setup path.
            self.loop.call_soon(self.look_up, client)

    async def _asked(self, client: Client, req: Request, shown: str) -> str:
        """The rule that allowed a request for a host off the list, once `ask` allowed it while
        the request was held; else the Refusal the agent can read."""
        error = f"{shown} is not on the egress allowlist (SIDECAR_EGRESS_ALLOW)"
        reason = "refused at once: nobody is asked (SIDECAR_EGRESS_ASK is not set)"
        if self.ask is not None:
            target = shown if req.method == "CONNECT" else f"http://{shown}{req.path}"

            async def peer() -> Peer | None:
                task = self.look_up(client, argv=True)
                return await task if task is not None else None

            assert client.transport is not None
            client.transport.resume_reading()  # to see the client go away while it waits
            answer = await self.ask(
                Asked(req.host, req.port, req.method, f"{req.method} {target}", peer)
            )
            client.transport.pause_reading()  # until the far end is there
            if answer.allowed:
                return answer.rule or "approval"
            reason = answer.reason
        if self.on_denied is not None:
            self.on_denied(req.host, req.port, "proxy")
        body: dict[str, object] = {
            "error": error, "host": req.host, "port": req.port, "reason": reason, "next": NEXT,
        }  # fmt: skip
        raise Refusal(403, f"{error}: {reason}", body)

    def look_up(self, client: Client, *, argv: bool = False) -> asyncio.Task[Peer | None] | None:
        """Start finding the process behind `client` (once; `argv`: its command line too, for
        an approval; None: nobody wants to know)."""
        if client.peer_task is None and self.find_peer is not None and client.transport:
            ends = (client.transport.get_extra_info("peername"),
                    client.transport.get_extra_info("sockname"))  # fmt: skip
            if ends[0] is not None and ends[1] is not None:
                client.peer_task = self.loop.create_task(self._peer(ends, argv))
        return client.peer_task

    async def _peer(self, ends: tuple[tuple[str, int], tuple[str, int]], argv: bool) -> Peer | None:
        assert self.find_peer is not None
        with contextlib.suppress(OSError):
            return await self.find_peer(ends[0][:2], ends[1][:2], argv)
        return None

    def ended(self, client: Client) -> None:
        """A client's connection is gone: its request's record, if it made one (once the
        process behind it is known)."""
        if client.req is None or self.on_closed is None:
            return
        task = client.peer_task
        if task is not None and not task.done():
            task.add_done_callback(lambda _: self._record(client))
            return
        self._record(client)

    def _record(self, client: Client) -> None:
        req = client.req
        assert req is not None and self.on_closed is not None
        peer = None
        task = client.peer_task
        if task is not None and task.done() and not task.cancelled():
            peer = task.result()
        upstream = client.peer
        self.on_closed(
            EgressConnectionRecord(
                host=req.host,
                port=req.port,
                how="proxy",
                method=req.method,
                allowed=client.refused is None and client.rule is not None,
                rule=client.rule,
                reason=client.refused,
                bytes_out=client.moved,
                bytes_in=upstream.moved if upstream is not None else 0,
                duration=round(time.monotonic() - client.opened, 3),
                pid=peer.pid if peer else None,
                exe=peer.exe if peer else None,
                uid=peer.uid if peer else None,
            )
        )

    def close_unlisted(self, patterns: Collection[str]) -> int:
        """Close the connections open under `patterns` (just taken off the list) whose host the
        list no longer allows; how many."""
        closed = 0
        for client in list(self.clients):
            req = client.req
            if req is not None and client.rule in patterns and self._decide(req) is None:
                client.close()
                closed += 1
        return closed

    def _join(self, client: Client, upstream: Upstream, req: Request) -> None:
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
            head = self._with_secrets(req.host, upstream_head(req))
            upstream.transport.write(head)
            client.moved += len(head)  # the request as the far end gets it
            client.budget = req.body
        early, client.buf = client.buf, b""
        client.pass_on(early)
        early, upstream.early = upstream.early, b""
        upstream.pass_on(early)
        client.transport.resume_reading()

    def _with_secrets(self, host: str, head: bytes) -> bytes:
        """A plain HTTP request's head as it goes out: the real values of the secrets listed
        for `host` in place of their placeholders."""
        if self.secrets is None:
            return head
        name = normalise_host(host) or host
        rewrite = self.secrets(name)
        if rewrite is not None:
            return rewrite(head)
        if self.unlisted is not None:
            self.unlisted(name, head)
        return head

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
