"""The secrets' rewrite (`sidecar.egress.substitute`): a listed host's request gets the real value
wherever the placeholder is in its request line or headers (Basic credentials included), never
in the body; another host gets the placeholder unchanged, counted. Pure tests of the rewrite,
then the plain HTTP path of a real proxy to a loopback server that records what reached it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sidecar.egress.allowlist import Pattern, parse_list, parse_pattern
from sidecar.egress.placeholders import load, make
from sidecar.egress.proxy import EgressProxy
from sidecar.egress.substitute import Substitution, Swap
from tests.proxytools import exchange

PLACEHOLDER = make("api")
VALUE = "sk-real-0123456789abcdef"
GIT_PLACEHOLDER = make("git")
GIT_VALUE = "ghp_realtoken0123456789"


def substitution(*hosts: str) -> Substitution:
    return Substitution(
        [
            Swap("api", PLACEHOLDER.encode(), VALUE.encode(), tuple(map(pattern, hosts))),
            Swap("git", GIT_PLACEHOLDER.encode(), GIT_VALUE.encode(), (pattern("*.git.test"),)),
        ]
    )


def pattern(text: str) -> Pattern:
    return parse_pattern("test", text)


def head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def test_a_placeholder_becomes_the_value_in_headers_and_the_query_string() -> None:
    sub = substitution("api.example.com")
    rewrite = sub("api.example.com")
    assert rewrite is not None
    out = rewrite(
        head(
            f"GET /v1/models?key={PLACEHOLDER} HTTP/1.1",
            "Host: api.example.com",
            f"x-api-key: {PLACEHOLDER}",
            f"Authorization: Bearer {PLACEHOLDER}",
        )
    )
    assert out == head(
        f"GET /v1/models?key={VALUE} HTTP/1.1",
        "Host: api.example.com",
        f"x-api-key: {VALUE}",
        f"Authorization: Bearer {VALUE}",
    )
    assert sub.unlisted == {"api": 0, "git": 0}


def test_no_rewrite_for_a_host_no_secret_is_listed_for_and_a_wildcard_is_subdomains_only() -> None:
    sub = substitution("api.example.com")
    assert sub("example.com") is None
    assert sub("evil.api.example.com") is None
    assert sub("git.test") is None  # `*.git.test` is the subdomains
    assert sub("code.git.test") is not None


def test_basic_credentials_are_decoded_swapped_and_encoded_again() -> None:
    """git sends its token as `Authorization: Basic base64(user:token)`."""
    sub = substitution("api.example.com")
    rewrite = sub("code.git.test")
    assert rewrite is not None
    basic = base64.b64encode(f"x-access-token:{GIT_PLACEHOLDER}".encode()).decode()
    out = rewrite(head("GET /repo.git/info/refs HTTP/1.1", f"Authorization: Basic {basic}"))
    sent = out.split(b"\r\n")[1].removeprefix(b"Authorization: Basic ")
    assert base64.b64decode(sent) == f"x-access-token:{GIT_VALUE}".encode()
    # Not base64, or without a placeholder: as it was.
    for line in ("Authorization: Basic not*base64", "Authorization: Basic dXNlcjpwYXNz"):
        assert rewrite(head("GET / HTTP/1.1", line)) == head("GET / HTTP/1.1", line)


def test_a_placeholder_to_a_host_it_is_not_listed_for_goes_unchanged_and_is_counted() -> None:
    sub = substitution("api.example.com")
    rewrite = sub("code.git.test")
    assert rewrite is not None
    sent = head("GET / HTTP/1.1", f"x-api-key: {PLACEHOLDER}")
    assert rewrite(sent) == sent  # the api key is not listed for the git host
    basic = base64.b64encode(f"u:{GIT_PLACEHOLDER}".encode()).decode()
    sub.scan("gist.example.net", head("GET / HTTP/1.1", f"Authorization: Basic {basic}"))
    sub.scan("gist.example.net", head("GET / HTTP/1.1", "Accept: */*"))
    assert sub.unlisted == {"api": 1, "git": 1}


def test_a_placeholder_split_over_two_lines_is_no_placeholder() -> None:
    """(The proxy refuses obs-fold heads before this: see test_egress_proxy.)"""
    sub = substitution("api.example.com")
    rewrite = sub("api.example.com")
    assert rewrite is not None
    half = len(PLACEHOLDER) // 2
    split = head("GET / HTTP/1.1", f"x-a: {PLACEHOLDER[:half]}", f"x-b: {PLACEHOLDER[half:]}")
    assert rewrite(split) == split


def test_placeholders_are_kept_in_a_private_file_and_the_same_next_time(tmp_path: Path) -> None:
    path = tmp_path / "placeholders.json"
    first = load(path, ["api", "git"])
    assert first["api"].startswith("sleeve-placeholder-api-") and len(first["api"]) == 55
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert load(path, ["api", "git"]) == first
    again = load(path, ["api", "new"])  # a secret added: the others keep theirs
    assert again["api"] == first["api"] and again["new"] != first["git"]
    path.write_text("{not json")
    assert load(path, ["api"])["api"] != first["api"]  # a broken file: new ones, no failure


# ---- the proxy's plain HTTP path ------------------------------------------------------------


class Recorder:
    """A loopback HTTP server that keeps each request's head and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[bytes, bytes]] = []
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            got = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in got.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            self.seen.append((got, await reader.readexactly(length)))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()


@contextlib.asynccontextmanager
async def proxied(sub: Substitution) -> AsyncIterator[tuple[EgressProxy, Recorder]]:
    far = Recorder()
    far.server = await asyncio.start_server(far.handle, "127.0.0.1", 0)
    allow = parse_list("SIDECAR_EGRESS_ALLOW", [f"localhost:{far.port}", f"127.0.0.1:{far.port}"])
    proxy = EgressProxy(allow, secrets=sub, unlisted=sub.scan)
    await proxy.start()
    try:
        yield proxy, far
    finally:
        await proxy.close()
        far.server.close()


@pytest.mark.parametrize("host", ["localhost", "LocalHost."])
async def test_the_proxy_sends_the_value_to_a_listed_host_and_never_in_the_body(host: str) -> None:
    """`localhost` (listed) and `127.0.0.1` (not listed) are the same loopback server."""
    sub = substitution("localhost")
    async with proxied(sub) as (proxy, far):
        body = f"echo {PLACEHOLDER}".encode()
        answer = await exchange(
            proxy,
            f"POST http://{host}:{far.port}/v1?k={PLACEHOLDER} HTTP/1.1\r\n"
            f"Host: {host}:{far.port}\r\nx-api-key: {PLACEHOLDER}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body,
        )
        assert answer.endswith(b"ok")
        answer = await exchange(
            proxy,
            f"GET http://127.0.0.1:{far.port}/ HTTP/1.1\r\n"
            f"x-api-key: {PLACEHOLDER}\r\n\r\n".encode(),
        )
        assert answer.endswith(b"ok")
    (listed_head, listed_body), (other_head, _) = far.seen
    assert f"POST /v1?k={VALUE} HTTP/1.1".encode() in listed_head
    assert f"x-api-key: {VALUE}".encode() in listed_head
    assert PLACEHOLDER.encode() not in listed_head
    assert listed_body == body  # the body as the client sent it
    assert f"x-api-key: {PLACEHOLDER}".encode() in other_head
    assert VALUE.encode() not in other_head
    assert sub.unlisted["api"] == 1
