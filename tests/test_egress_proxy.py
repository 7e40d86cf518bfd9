"""The egress proxy (`sidecar.egress.proxy`) on real loopback sockets: small servers on
127.0.0.1 stand for the allowed and the forbidden hosts (listed as `127.0.0.1:PORT`, or by the
name `localhost`, which resolves to loopback), and raw clients speak HTTP/1.1 to the proxy the
way curl, Node and pip do. Nothing leaves loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sidecar.egress.allowlist import parse_list
from sidecar.egress.heads import Refusal, parse_head
from sidecar.egress.proxy import EgressProxy, Limits
from tests.harness import wait_for_async
from tests.proxytools import exchange

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server with a handler; `seen` holds each request head it read."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def start(self, handler: Handler) -> Server:
        async def tracked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.add(writer)
            await handler(reader, writer)

        self.server = await asyncio.start_server(tracked, "127.0.0.1", 0, backlog=1024)
        return self

    async def close(self) -> None:
        """Close the server and every connection it took (the handlers then end)."""
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in self.writers), return_exceptions=True)


async def http_handler(server: Server) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            server.seen.append(head)
            body = b"hello from " + head.split(b" ")[1]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
        writer.close()

    return handle


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def proxy_for(
    patterns: str, limits: Limits | None = None
) -> AsyncIterator[tuple[EgressProxy, list[tuple[str, int, str]]]]:
    denied: list[tuple[str, int, str]] = []
    proxy = EgressProxy(
        parse_list("SIDECAR_EGRESS_ALLOW", patterns.split()),
        on_denied=lambda h, p, how: denied.append((h, p, how)),
        limits=limits,
    )
    await proxy.start()
    try:
        yield proxy, denied
    finally:
        await proxy.close()


async def ask(
    proxy: EgressProxy, data: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Send `data`, return the connection and the response head."""
    reader, writer = await asyncio.open_connection(*proxy.address)
    writer.write(data)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    return reader, writer, head


@pytest.fixture
async def web() -> AsyncIterator[Server]:
    server = Server()
    await server.start(await http_handler(server))
    yield server
    await server.close()


async def test_plain_http_to_an_allowed_host_is_forwarded_in_origin_form(web: Server) -> None:
    async with proxy_for(f"127.0.0.1:{web.port}") as (proxy, denied):
        url = f"http://127.0.0.1:{web.port}/a?b=1"
        answer = await exchange(
            proxy,
            f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{web.port}\r\n"
            "Proxy-Connection: keep-alive\r\n\r\n".encode(),
        )
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"hello from /a?b=1")
    (seen,) = web.seen
    assert seen.startswith(b"GET /a?b=1 HTTP/1.1\r\n")
    assert b"Connection: close" in seen and b"Proxy-Connection" not in seen
    assert denied == []


async def test_a_second_request_on_the_connection_is_not_carried() -> None:
    """The far end is asked for one request; a client that reuses the connection for another
    (maybe for another host) is closed, never passed on to the first one's far end, even when
    that far end keeps the connection open."""
    heard: list[bytes] = []

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                heard.append(data)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        writer.close()

    server = await Server().start(keep_alive)
    async with proxy_for(f"127.0.0.1:{server.port}") as (proxy, _):
        reader, writer, head = await ask(
            proxy, f"GET http://127.0.0.1:{server.port}/one HTTP/1.1\r\n\r\n".encode()
        )
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await reader.readexactly(2) == b"ok"
        writer.write(b"GET http://evil.example/two HTTP/1.1\r\n\r\n")
        assert await asyncio.wait_for(reader.read(-1), 5) == b""
        writer.close()
    await server.close()
    assert b"".join(heard).count(b"GET ") == 1


async def test_a_host_off_the_list_is_403_with_a_json_body_the_agent_can_read(web: Server) -> None:
    async with proxy_for("127.0.0.1:1") as (proxy, denied):
        answer = await exchange(
            proxy, f"GET http://127.0.0.1:{web.port}/ HTTP/1.1\r\n\r\n".encode()
        )
        connect = await exchange(proxy, b"CONNECT example.com:443 HTTP/1.1\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden")
    assert b"\r\nContent-Type: application/json\r\n" in head
    document = json.loads(body)
    assert document["error"] == f"127.0.0.1:{web.port} is not on the egress allowlist" + (
        " (SIDECAR_EGRESS_ALLOW)"
    )
    assert (document["host"], document["port"]) == ("127.0.0.1", web.port)
    assert "SIDECAR_EGRESS_ASK is not set" in document["reason"]
    assert "PATCH /egress" in document["next"]
    assert connect.startswith(b"HTTP/1.1 403 ")
    assert web.seen == []
    assert denied == [("127.0.0.1", web.port, "proxy"), ("example.com", 443, "proxy")]


async def test_connect_tunnels_to_an_allowed_name_and_not_to_another_port() -> None:
    server = await Server().start(echo)
    async with proxy_for(f"localhost:{server.port}") as (proxy, denied):
        reader, writer, head = await ask(
            proxy, f"CONNECT localhost:{server.port} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
        )
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        writer.close()
        other = await exchange(proxy, b"CONNECT localhost:443 HTTP/1.1\r\n\r\n")
        assert other.startswith(b"HTTP/1.1 403 ")
        assert denied == [("localhost", 443, "proxy")]
    await server.close()


async def test_host_header_disagreeing_with_the_uri_is_400_both_ways(web: Server) -> None:
    allowed = f"127.0.0.1:{web.port}"
    async with proxy_for(allowed) as (proxy, _):
        forbidden_uri = await exchange(
            proxy, f"GET http://evil.example/ HTTP/1.1\r\nHost: {allowed}\r\n\r\n".encode()
        )
        allowed_uri = await exchange(
            proxy, f"GET http://{allowed}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode()
        )
        port_only = await exchange(
            proxy, f"GET http://{allowed}/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n".encode()
        )
    for answer in (forbidden_uri, allowed_uri, port_only):
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert b"disagrees with the request's host" in answer
    assert web.seen == []


async def test_a_64_kib_request_line_is_refused_and_others_are_served(web: Server) -> None:
    async with proxy_for(f"127.0.0.1:{web.port}") as (proxy, _):
        reader, writer = await asyncio.open_connection(*proxy.address)
        writer.write(b"GET http://127.0.0.1/" + b"a" * 65536 + b" HTTP/1.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(-1), 10)  # read to EOF: it is closed
        writer.close()
        headers = b"GET http://127.0.0.1/ HTTP/1.1\r\n" + b"X-A: b\r\n" * 8000 + b"\r\n"
        big_head = await exchange(proxy, headers)
        ok = await exchange(proxy, f"GET http://127.0.0.1:{web.port}/ HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 414 ")
    assert big_head.startswith(b"HTTP/1.1 431 ")
    assert ok.startswith(b"HTTP/1.1 200 ")


async def test_a_thousand_tunnels_at_once_are_bounded_and_nothing_hangs() -> None:
    server = await Server().start(echo)
    limits = Limits(max_tunnels=100, max_clients=300)
    async with proxy_for(f"127.0.0.1:{server.port}", limits) as (proxy, _):
        request = f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\n\r\n".encode()

        async def attempt() -> tuple[bytes, asyncio.StreamWriter | None]:
            try:
                reader, writer = await asyncio.open_connection(*proxy.address)
            except ConnectionError:
                return b"reset", None
            try:
                writer.write(request)
                line = await asyncio.wait_for(reader.readline(), 15)
            except ConnectionError:
                writer.close()
                return b"reset", None
            return line, writer

        began = time.monotonic()
        results = await asyncio.gather(*(attempt() for _ in range(1000)))
        statuses = [line.split(b" ")[1] if line.count(b" ") >= 2 else line for line, _ in results]
        assert statuses.count(b"200") == 100  # the tunnel bound
        assert set(statuses) <= {b"200", b"503", b"", b"reset"}
        assert time.monotonic() - began < 15
        assert proxy.tunnels == 100
        for _, writer in results:
            if writer is not None:
                writer.close()
        await wait_for_async(
            lambda: not (proxy.tunnels or proxy.clients),
            10,
            what=lambda: f"every tunnel closed ({proxy.tunnels}, {len(proxy.clients)} left)",
        )
        _, writer, head = await ask(proxy, request)
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.close()
    await server.close()


async def test_a_far_end_that_speaks_first_is_heard() -> None:
    """A server that sends before the client says anything (SSH, SMTP banners): its first
    bytes arrive in the moment between the connect and the tunnel's joining, and are kept."""

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-hello\r\n")
        await writer.drain()
        await reader.read()
        writer.close()

    server = await Server().start(banner)
    async with proxy_for(f"127.0.0.1:{server.port}") as (proxy, _):
        reader, writer, head = await ask(
            proxy, f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert head.startswith(b"HTTP/1.1 200 ")
        assert await asyncio.wait_for(reader.readline(), 5) == b"SSH-2.0-hello\r\n"
        writer.close()
    await server.close()


def blackhole() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket that never accepts, its backlog filled: the kernel drops further SYNs,
    so a connect to it neither succeeds nor fails (a far end that never answers)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    fillers: list[socket.socket] = []
    for _ in range(8):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(listener.getsockname())
        fillers.append(s)
    return listener, fillers


async def test_a_far_end_that_never_answers_is_504_after_the_connect_timeout() -> None:
    listener, fillers = blackhole()
    port = listener.getsockname()[1]
    try:
        async with proxy_for(f"127.0.0.1:{port}", Limits(connect_timeout=0.5)) as (proxy, _):
            began = time.monotonic()
            answer = await exchange(proxy, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            took = time.monotonic() - began
            assert proxy.tunnels == 0
    finally:
        for s in (listener, *fillers):
            s.close()
    assert answer.startswith(b"HTTP/1.1 504 "), answer
    assert b"did not answer within 0.5 s" in answer
    assert 0.4 < took < 5


async def test_a_stalled_client_stalls_neither_the_proxy_nor_another_client(web: Server) -> None:
    """The far end sends without end to a client that never reads: the proxy stops reading
    from the far end (the firehose's writes block) and keeps serving another client."""
    sent = 0

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        chunk = b"x" * 65536
        try:
            while True:
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
        except ConnectionError:
            writer.close()

    hose = await Server().start(firehose)
    patterns = f"127.0.0.1:{hose.port} 127.0.0.1:{web.port}"
    async with proxy_for(patterns) as (proxy, _):
        _, stalled, head = await ask(
            proxy, f"CONNECT 127.0.0.1:{hose.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert head.startswith(b"HTTP/1.1 200 ")
        # Wait until the firehose is held back: nothing more goes out for a while.
        deadline, last = time.monotonic() + 10, -1
        while sent != last:
            assert time.monotonic() < deadline
            last = sent
            await asyncio.sleep(0.3)  # sleep-ok: quiet for this long is what "held back" means
        assert sent < 64 * 1024 * 1024  # socket buffers and one write buffer, not the stream
        for _ in range(3):
            ok = await exchange(
                proxy, f"GET http://127.0.0.1:{web.port}/ HTTP/1.1\r\n\r\n".encode()
            )
            assert ok.startswith(b"HTTP/1.1 200 ")
        stalled.close()
    await hose.close()


async def test_quiet_tunnels_and_slow_heads_are_closed() -> None:
    server = await Server().start(echo)
    limits = Limits(idle_timeout=0.3, head_timeout=0.3)
    async with proxy_for(f"127.0.0.1:{server.port}", limits) as (proxy, _):
        reader, writer, _ = await ask(
            proxy, f"CONNECT 127.0.0.1:{server.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert await asyncio.wait_for(reader.read(-1), 5) == b""  # closed by the proxy
        writer.close()
        slow = await exchange(proxy, b"GET http://127.0.0.1/ HTTP/1.1\r\n")
        assert slow.startswith(b"HTTP/1.1 408 ")
    await server.close()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /relative HTTP/1.1", 400),
        (b"GET https://example.com/ HTTP/1.1", 400),
        (b"GET http://user@example.com/ HTTP/1.1", 400),
        (b"CONNECT example.com HTTP/1.1", 400),
        (b"CONNECT example.com:99999 HTTP/1.1", 400),
        (b"GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\nHost: b.com", 400),
        (b"POST http://a.com/ HTTP/1.1\r\nTransfer-Encoding: chunked", 411),
        (b"GET http://a.com/ HTTP/2", 400),
        (b"GET http://a.com/ HTTP/1.1\r\n folded", 400),
    ],
)
def test_heads_the_proxy_will_not_carry(head: bytes, status: int) -> None:
    with pytest.raises(Refusal) as err:
        parse_head(head)
    assert err.value.status == status


def test_heads_it_carries() -> None:
    req = parse_head(b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443")
    assert (req.host, req.port) == ("::1", 8443)
    req = parse_head(b"POST http://A.com.?q HTTP/1.1\r\nHost: a.com:80\r\nContent-Length: 3")
    assert (req.host, req.port, req.path, req.body) == ("A.com.", 80, "/?q", 3)
