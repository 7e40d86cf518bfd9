"""The egress proxy's HTTP/1.1 request heads: parsed into what the proxy decides on, rewritten
for the far end (origin form, one request, closed after it), and its one-line refusals. Pure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from sidecar.egress.allowlist import normalise_host


class Refusal(Exception):
    """The request is answered with `status` and a one-line `reason`, and closed; with `body`,
    the answer is that JSON object instead (a refused host: what the agent can act on)."""

    def __init__(self, status: int, reason: str, body: dict[str, object] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.body = body


PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    411: "Length Required",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f]")  # C0 but HTAB, and DEL
# Hop-by-hop headers (RFC 9110 7.6.1) and the proxy's own: never sent on to the far end.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "proxy-authenticate",
        "te",
        "trailer",
        "upgrade",
    }
)


@dataclass(frozen=True)
class Request:
    method: str
    host: str  # as asked for (a name, or an IP literal without brackets)
    port: int
    path: str  # the origin-form target for plain HTTP; "" for CONNECT
    headers: list[tuple[str, str]]
    body: int  # Content-Length of a plain HTTP request (0 for CONNECT)


def authority_of(text: str, default_port: int | None) -> tuple[str, int]:
    """`host[:port]` (IPv6 in brackets) into host and port; Refusal(400) when malformed."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
        if rest and port_text is None:
            raise Refusal(400, f"malformed authority {text!r}")
    else:
        host, colon, port_text_ = text.rpartition(":")
        if not colon or ":" in host:  # no port, or a bare IPv6 address
            host, port_text = text, None
        else:
            port_text = port_text_
    if port_text is None:
        if default_port is None:
            raise Refusal(400, f"CONNECT needs host:port, got {text!r}")
        return host, default_port
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise Refusal(400, f"bad port in {text!r}")
    return host, int(port_text)


def _plain_target(target: str, by_name: dict[str, list[str]]) -> tuple[str, int, str, int]:
    """host, port, origin-form path and body length of a plain HTTP proxy request."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        why = "https:// in a request line (use CONNECT)" if scheme.lower() == "https" else ""
        raise Refusal(400, why or "a proxy request needs an absolute http:// URI")
    cut = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:].partition("#")[0]
    if "@" in authority:
        raise Refusal(400, "credentials in the URI are not carried")
    host, port = authority_of(authority, 80)
    if by_name.get("transfer-encoding"):
        raise Refusal(411, "a request body must have a Content-Length")
    lengths = set(by_name.get("content-length", []))
    if len(lengths) > 1 or any(not v.isdigit() for v in lengths):
        raise Refusal(400, "bad Content-Length")
    body = int(lengths.pop()) if lengths else 0
    return host, port, path if path.startswith("/") else "/" + path, body


def header_fields(lines: list[str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise Refusal(400, "malformed header line")
        headers.append((name, value.strip()))
    return headers


def parse_head(head: bytes) -> Request:
    """The request head (without its blank line) as a Request; Refusal when the proxy will
    not carry it."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise Refusal(400, "malformed request line") from None
    # A bare LF, a CR, a NUL inside a line: a far end that splits lines another way would read
    # a header the checks below never saw (a second Host). Tabs only in a header's value.
    if CONTROL.search(lines[0].replace("\t", "\0")) or any(map(CONTROL.search, lines[1:])):
        raise Refusal(400, "a control character inside a line of the request head")
    if not version.startswith("HTTP/1."):
        raise Refusal(400, f"unsupported protocol {version!r}")
    headers = header_fields(lines[1:])
    by_name: dict[str, list[str]] = {}
    for name, value in headers:
        by_name.setdefault(name.lower(), []).append(value)
    if len(by_name.get("host", [])) > 1:
        raise Refusal(400, "more than one Host header")
    if method == "CONNECT":
        host, port = authority_of(target, None)
        path, body = "", 0
    else:
        host, port, path, body = _plain_target(target, by_name)
    if not host:
        raise Refusal(400, "no host in the request")
    for value in by_name.get("host", []):
        # The host that decides is the one in the request line: a Host header naming another
        # would have the far end serve that one (a shared CDN, a virtual host).
        said_host, said_port = authority_of(value, port)
        if (normalise_host(said_host), said_port) != (normalise_host(host), port):
            raise Refusal(400, f"Host header {value!r} disagrees with the request's host")
    return Request(method, host.strip("[]"), port, path, headers, body)


def upstream_head(req: Request) -> bytes:
    """The plain HTTP request as the far end gets it: origin form, one request, then closed."""
    lines = [f"{req.method} {req.path} HTTP/1.1"]
    lines += [f"{n}: {v}" for n, v in req.headers if n.lower() not in HOP_HEADERS]
    if not any(n.lower() == "host" for n, _ in req.headers):
        host = f"[{req.host}]" if ":" in req.host else req.host
        lines.append(f"Host: {host}" if req.port == 80 else f"Host: {host}:{req.port}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def refusal_bytes(status: int, reason: str, document: dict[str, object] | None = None) -> bytes:
    """The refusal's answer: `reason` as one line of text, or `document` as JSON."""
    if document is None:
        body, kind = f"{reason}\n".encode("utf-8", "replace"), "text/plain; charset=utf-8"
    else:
        body, kind = json.dumps(document).encode() + b"\n", "application/json"
    head = (
        f"HTTP/1.1 {status} {PHRASES.get(status, 'Error')}\r\n"
        f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body
