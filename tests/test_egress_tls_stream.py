"""The framing of requests on a terminated TLS connection (`sidecar.egress.stream`): what
passes on, byte for byte, whatever the reads' boundaries; and what is refused. Pure."""

from __future__ import annotations

import pytest

from sidecar.egress.heads import Refusal
from sidecar.egress.stream import Requests

P, R = b"PLACEHOLDER", b"real-value!"


def feed_all(data: bytes, step: int, host: str = "api.example", port: int = 443) -> bytes:
    requests = Requests(host, port, lambda head: head.replace(P, R), 32 * 1024)
    return b"".join(requests.feed(data[i : i + step]) for i in range(0, len(data), step))


def head(path: str, *extra: str, host: str = "api.example") -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


PIPELINED = (
    head("/a", "Content-Length: 11", f"X-Key: {P.decode()}") + P
    + head("/b", "Transfer-Encoding: chunked", f"X-Key: {P.decode()}")
    + b"5;ext=1\r\n" + P[:5] + b"\r\n6\r\n" + P[5:] + b"\r\n0\r\nTrailer-X: " + P + b"\r\n\r\n"
    + b"\r\n" + head("/c", f"X-Key: {P.decode()}")
)  # fmt: skip


@pytest.mark.parametrize("step", [1, 3, 17, len(PIPELINED)])
def test_pipelined_requests_have_each_head_rewritten_and_bodies_unchanged(step: int) -> None:
    out = feed_all(PIPELINED, step)
    # Three heads rewritten; the Content-Length body, the chunks and the trailer as they were
    # (the empty line between two requests is dropped).
    assert out.count(b"X-Key: " + R) == 3
    expected = PIPELINED.replace(b"X-Key: " + P, b"X-Key: " + R)
    assert out == expected.replace(b"\r\n\r\n\r\nPOST /c", b"\r\n\r\nPOST /c")


def test_after_an_upgrade_everything_passes_blind() -> None:
    upgrade = head("/ws", "Connection: Upgrade", "Upgrade: websocket", f"X-Key: {P.decode()}")
    frames = b"\x81\x0b" + P + head("/not-a-request", f"X-Key: {P.decode()}")
    assert feed_all(upgrade + frames, 7) == upgrade.replace(P, R) + frames


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (head("/", host="other.example"), 400),  # another host on the same connection
        (head("/", host="api.example:8443"), 400),  # another port
        (b"GET https://other.example/ HTTP/1.1\r\nHost: api.example\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),  # no Host
        (head("/", "Host: api.example"), 400),  # two
        (head("/", "Content-Length: 3", "Transfer-Encoding: chunked"), 400),  # smuggling
        (head("/", "Content-Length: 3", "Content-Length: 4"), 400),
        (head("/", "Transfer-Encoding: gzip"), 400),  # no end to find
        (head("/", "Transfer-Encoding: chunked") + b"zz\r\n", 400),
        (head("/", "X-A: a\rb"), 400),  # a bare CR
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: api.example\r\nX: " + b"a" * 40000, 431),
    ],
)
def test_a_request_the_far_end_could_read_another_way_is_refused(data: bytes, status: int) -> None:
    with pytest.raises(Refusal) as caught:
        feed_all(data, 1000)
    assert caught.value.status == status


def test_the_host_may_be_named_with_its_port_or_in_another_case() -> None:
    for host in ("API.example:443", "api.example."):
        assert feed_all(head("/", host=host), 5) == head("/", host=host)


def test_a_rewrite_that_would_add_a_line_is_refused() -> None:
    requests = Requests("api.example", 443, lambda h: h.replace(P, b"x\r\nHost: evil"), 32768)
    with pytest.raises(Refusal) as caught:
        requests.feed(head("/", f"X-Key: {P.decode()}"))
    assert caught.value.status == 502
