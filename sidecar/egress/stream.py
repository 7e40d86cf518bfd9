"""The requests a client sends on a connection whose heads carry a secret (terminated TLS, or
plain HTTP inside a CONNECT), one after another: each head is found, checked and handed to the
secret's rewrite; bodies (Content-Length or chunked) pass as they are; after an Upgrade (or a
CONNECT inside) everything passes blind. Pure.

Written here rather than taken from h11: only the framing of requests is needed (responses
pass unchanged), and h11 would parse and write every head again, and every response too.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from sidecar.egress.allowlist import normalise_host
from sidecar.egress.heads import CONTROL, Refusal, authority_of, header_fields

MAX_LINE = 4096  # a chunk's size line or a trailer line


def _tokens(values: list[str]) -> list[str]:
    """A list header's tokens, lower case, in order."""
    return [token.strip().lower() for value in values for token in value.split(",")]


class Mode(enum.Enum):
    HEAD = "head"  # reading a request head
    BODY = "body"  # `left` bytes of a body (or of a chunk and its CRLF) to pass on
    SIZE = "size"  # a chunk's size line
    TRAILER = "trailer"  # the trailer lines after the last chunk, up to an empty one
    BLIND = "blind"  # an upgraded connection: everything passes as it is


class Requests:
    """The client's bytes of a connection to `host`:`port` whose heads carry a secret (TLS the
    proxy terminates, or with `tls` False plain HTTP inside a CONNECT), as the far end gets
    them: `feed` returns what to pass on (heads rewritten by `rewrite`); Refusal on a request
    the proxy will not carry (the caller answers it, or closes when requests went before)."""

    def __init__(
        self,
        host: str,
        port: int,
        rewrite: Callable[[bytes], bytes],
        max_head: int,
        *,
        tls: bool = True,
    ) -> None:
        self.host = normalise_host(host) or host
        self.port = port
        self.scheme = "https" if tls else "http"
        self.rewrite = rewrite
        self.max_head = max_head
        self.mode = Mode.HEAD
        self.left = 0
        self.after = Mode.HEAD  # the mode once `left` bytes went
        self.buf = b""
        self.requests = 0  # heads passed on

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        buf = self.buf + data if self.buf else data
        self.buf = b""
        while buf:
            if self.mode is Mode.BLIND:
                out.append(buf)
                break
            if self.mode is Mode.BODY:
                taken = buf[: self.left]
                out.append(taken)
                buf = buf[len(taken) :]
                self.left -= len(taken)
                if not self.left:
                    self.mode = self.after
                continue
            if self.mode is Mode.HEAD:
                buf = buf.lstrip(b"\r\n")  # empty lines between requests are allowed (RFC 9112)
                end = buf.find(b"\r\n\r\n")
                if end < 0 or end > self.max_head:
                    if len(buf) > self.max_head:
                        raise Refusal(431, f"request head longer than {self.max_head} bytes")
                    self.buf = buf
                    break
                out.append(self._head(buf[: end + 4]))
                buf = buf[end + 4 :]
                continue
            end = buf.find(b"\r\n")
            if end < 0 or end > MAX_LINE:
                if len(buf) > MAX_LINE:
                    raise Refusal(400, f"a chunked body's line longer than {MAX_LINE} bytes")
                self.buf = buf
                break
            out.append(buf[: end + 2])
            self._line(buf[:end])
            buf = buf[end + 2 :]
        return b"".join(out)

    def _line(self, line: bytes) -> None:
        """A chunk's size line, or a trailer line."""
        if self.mode is Mode.TRAILER:
            if not line:
                self.mode = Mode.HEAD
            return
        size = line.split(b";", 1)[0].strip()
        try:
            if not size or size.startswith((b"+", b"-", b"0x", b"0X")):
                raise ValueError(size)
            length = int(size, 16)
        except ValueError:
            raise Refusal(400, "a malformed chunk size in a chunked body") from None
        if length:
            self.mode, self.left, self.after = Mode.BODY, length + 2, Mode.SIZE  # its CRLF too
        else:
            self.mode = Mode.TRAILER

    def _head(self, head: bytes) -> bytes:
        """One request head (with its blank line), checked and rewritten; the mode set for
        what follows it."""
        lines = head[:-4].decode("latin-1").split("\r\n")
        try:
            method, target, version = lines[0].split(" ")
        except ValueError:
            raise Refusal(400, "malformed request line") from None
        if CONTROL.search(lines[0].replace("\t", "\0")) or any(map(CONTROL.search, lines[1:])):
            raise Refusal(400, "a control character inside a line of the request head")
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise Refusal(400, f"unsupported protocol {version!r}")
        by_name: dict[str, list[str]] = {}
        for name, value in header_fields(lines[1:]):
            by_name.setdefault(name.lower(), []).append(value)
        self._check_host(target, by_name.get("host", []))
        self._frame(method, by_name)
        rewritten = self.rewrite(head)
        if rewritten.count(b"\n") != head.count(b"\n") or not rewritten.endswith(b"\r\n\r\n"):
            raise Refusal(502, "a secret's value would change the request head's lines")
        self.requests += 1
        return rewritten

    def _check_host(self, target: str, hosts: list[str]) -> None:
        """The request names the host the tunnel was opened to, and no other: a far end that
        serves several (a CDN) must not be asked for another with the secret."""
        if len(hosts) != 1:
            raise Refusal(400, "a request needs exactly one Host header")
        said = [hosts[0]]
        scheme, sep, rest = target.partition("://")
        if sep:
            if scheme.lower() != self.scheme:
                raise Refusal(400, f"a {scheme} URI inside a connection for {self.scheme}")
            said.append(rest.split("/", 1)[0].split("?", 1)[0])
        for authority in said:
            host, port = authority_of(authority, 443 if self.scheme == "https" else 80)
            # As the client wrote it nearly always: normalising (IDNA, addresses) costs more.
            same = host == self.host or normalise_host(host.strip("[]")) == self.host
            if not same or port != self.port:
                raise Refusal(400, f"{authority!r} is not the host this connection was opened to")

    def _frame(self, method: str, by_name: dict[str, list[str]]) -> None:
        """Where this request's body ends (RFC 9112 6.3)."""
        codings = _tokens(by_name.get("transfer-encoding", []))
        lengths = set(by_name.get("content-length", []))
        connection = set(_tokens(by_name.get("connection", [])))
        if codings:
            if lengths or codings[-1] != "chunked":
                raise Refusal(400, "a body framed two ways, or not ending chunked")
            self.mode = Mode.SIZE
        elif lengths:
            if len(lengths) > 1 or not all(v.isdigit() for v in lengths):
                raise Refusal(400, "bad Content-Length")
            self.left = int(lengths.pop())
            self.mode, self.after = (Mode.BODY, Mode.HEAD) if self.left else (Mode.HEAD, Mode.HEAD)
        if method == "CONNECT" or ("upgrade" in connection and "upgrade" in by_name):
            # What follows is another protocol (a WebSocket, say): passed on blind. A far end
            # that refuses the upgrade and reads on gets the next requests as they were sent.
            if self.mode is not Mode.HEAD:
                raise Refusal(400, "an upgrade with a body")
            self.mode = Mode.BLIND
