"""A CONNECT to a host that has a secret: answered, then the client's first byte decides. A TLS
handshake is terminated: the far end's TLS first (verified against the system's CAs and
SIDECAR_EGRESS_CA_FILE, the host as SNI), then the client's with the sleeve CA's certificate for
the host. Anything else is plain HTTP, sent on over TCP. Either way each request head then goes
through the secret's rewrite (`sidecar.egress.stream`); bodies and responses pass as they are.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import socket
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.core.layout import Layout
from sidecar.egress.allowlist import normalise_host
from sidecar.egress.authority import Authority, AuthorityError, trust_env
from sidecar.egress.heads import Refusal
from sidecar.egress.pump import Pump
from sidecar.egress.stream import Requests

if TYPE_CHECKING:
    from sidecar.egress.heads import Request
    from sidecar.egress.proxy import EgressProxy, Rewrite
    from sidecar.egress.sides import Client, Upstream

log = logging.getLogger(__name__)

ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"
TLS_HANDSHAKE = 0x16  # the first byte of a TLS record that carries a handshake (ClientHello)


def upstream_context(ca_file: Path | None) -> ssl.SSLContext:
    """How the proxy checks a far end it terminates for: the system's CAs, plus `ca_file`'s
    (SIDECAR_EGRESS_CA_FILE: a corporate CA) when set; HTTP/1.1 only. OSError or SSLError
    when `ca_file` cannot be read."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # the certificate and the name checked
    capath = ssl.get_default_verify_paths().capath
    if capath and glob.glob(os.path.join(glob.escape(capath), "*.0")):
        # The hashed directory: OpenSSL reads a root when a chain needs it, where the bundle
        # file would be parsed whole into memory (~0.9 MiB for Debian's).
        context.load_verify_locations(capath=capath)
    else:
        context.load_default_certs()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    context.set_alpn_protocols(["http/1.1"])
    return context


@dataclass(frozen=True)
class Termination:
    """What the proxy terminates TLS with: the sleeve's CA and the far ends' trust."""

    authority: Authority
    upstream: ssl.SSLContext


async def prepare(
    layout: Layout, hosts: Iterable[str], ca_file: Path | None
) -> tuple[Termination, dict[str, str]]:
    """For a sleeve whose `hosts` have a secret (made before the CLI starts, whose fence
    grants only what exists then): the proxy's termination, with the CA kept in the state dir
    (made the first time), and the CLI's variables that make it trust that CA. AuthorityError,
    OSError or SSLError when the CA or `ca_file` (SIDECAR_EGRESS_CA_FILE) cannot be used."""
    authority = Authority(layout.egress_ca, hosts)
    await authority.load()
    authority.write_trust(layout.egress_ca_public, layout.egress_ca_bundle, ca_file)
    termination = Termination(authority, upstream_context(ca_file))
    return termination, trust_env(layout.egress_ca_public, layout.egress_ca_bundle)


class Editor:
    """The client's bytes on their way to the far end: `Requests.feed`, and a request the
    proxy will not carry answered (the first: `answer`) or the connection closed (later ones,
    whose answers may still be on their way: `end`). `failed`: the far end could not be
    reached over TLS; the first request gets that as its 502."""

    def __init__(self, client: Client, requests: Requests) -> None:
        self.client = client
        self.requests = requests
        self.failed: str | None = None
        self.answer: Callable[[int, str], None] = client.refuse
        self.end: Callable[[], None] = client.close

    def __call__(self, data: bytes) -> bytes:
        try:
            out = self.requests.feed(data)
            if self.failed is not None and self.requests.requests:
                raise Refusal(502, self.failed)
        except Refusal as refusal:
            self.client.refused = str(refusal)
            if self.requests.requests <= (self.failed is not None):
                self.answer(refusal.status, str(refusal))
            else:
                log.info("egress: closing a terminated connection: %s", refusal)
                self.end()
            return b""
        return out


async def terminate(proxy: EgressProxy, client: Client, upstream: Upstream, req: Request,
                    rewrite: Rewrite) -> None:  # fmt: skip
    """Join `client` (its CONNECT read) and `upstream` (connected), each request head through
    the secret's rewrite: over TLS on both sides (in a thread of its own: `Pump`) when the
    client's first byte in the tunnel starts a TLS handshake, else as the plain HTTP it sends
    (a client that tunnels even its http:// requests: Gemini CLI's). Refusal while the CONNECT
    can still be answered."""
    host = normalise_host(req.host) or req.host
    shown = f"[{host}]:{req.port}" if ":" in host else f"{host}:{req.port}"
    termination = proxy.termination
    raw = client.transport
    assert raw is not None
    try:
        if termination is None:
            msg = f"{shown} has a secret but the proxy has no CA to terminate TLS with"
            raise Refusal(502, msg)
        if client.buf:
            raise Refusal(400, "bytes after the CONNECT before its answer")
        try:
            context = await termination.authority.context(host)
        except (AuthorityError, OSError, ssl.SSLError) as exc:
            raise Refusal(502, f"no certificate for {shown}: {exc}") from None
        raw.write(ESTABLISHED)
        first = await _first_byte(proxy, raw)
    except BaseException:
        upstream.close()
        raise
    if first is None:
        client.refused = "the client sent nothing through the tunnel (or closed it)"
        client.close()
        upstream.close()
        return
    tls = first == TLS_HANDSHAKE
    editor = Editor(client, Requests(host, req.port, rewrite, proxy.limits.max_head, tls=tls))
    if client.timer is not None:
        client.timer.cancel()
        client.timer = None
    client.peer = upstream
    if tls:
        pump = Pump(proxy.loop, client, upstream, host, shown)
        client.pump = pump
        pump.start(context, termination.upstream, editor)
    else:
        _link(client, upstream, raw, editor)
    if proxy.on_closed is not None:
        proxy.loop.call_soon(proxy.look_up, client)


async def _first_byte(proxy: EgressProxy, raw: asyncio.Transport) -> int | None:
    """The first byte the client sends through its tunnel, left unread (peeked on a duplicate
    of its socket while the transport is paused: a TLS handshake must reach the TLS layer
    whole); None when it closes or sends nothing within the head timeout."""
    if raw.is_closing():
        return None
    sock = raw.get_extra_info("socket").dup()  # closing a duplicate leaves the connection
    ready: asyncio.Future[None] = proxy.loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    try:
        proxy.loop.add_reader(sock.fileno(), readable)
        try:
            await asyncio.wait_for(ready, proxy.limits.head_timeout)
        finally:
            proxy.loop.remove_reader(sock.fileno())  # before the close: epoll keeps it else
        first: bytes = sock.recv(1, socket.MSG_PEEK)
    except (OSError, TimeoutError):
        return None
    finally:
        sock.close()
    return first[0] if first else None


def _link(client: Client, upstream: Upstream, raw: asyncio.Transport, editor: Editor) -> None:
    """Plain HTTP inside the tunnel: the two transports joined, the client's bytes through
    `editor`."""
    upstream.peer = client
    client.edit = editor
    early_in, upstream.early = upstream.early, b""
    upstream.pass_on(early_in)
    if not raw.is_closing() and not raw.is_reading():
        raw.resume_reading()  # paused since the CONNECT (or by the client holding a head)
