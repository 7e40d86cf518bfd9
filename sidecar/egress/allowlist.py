"""The egress allowlist: host patterns from `SIDECAR_EGRESS_ALLOW`/`_FILE` parsed into data,
and the one question the proxy asks of it (may this host name and port be reached?).

Pure: no sockets, no environment. Patterns are an exact host (a name or an IP literal) or
`*.suffix`, with an optional `:port` (none: 80 and 443); matching is on the host name asked
for, normalised the same way (lower case, trailing dot gone, IDNA), never on an address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sidecar.core.files import TooBig, read_limited

DEFAULT_PORTS = (80, 443)
NONE = "none"  # the list spelled so allows nothing (an empty list is an error: a typo?)
MAX_PATTERNS = 10_000
MAX_FILE = 1024 * 1024  # bytes an allow file may hold
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


class AllowlistError(ValueError):
    """A pattern or the list is unusable; the message names the variable and the pattern."""


def normalise_host(host: str) -> str | None:
    """`host` as the list compares it: an IP literal in its canonical text (brackets gone), a
    name in lower-case ASCII (IDNA) without a trailing dot; None when it is neither."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    host = host.removesuffix(".")
    if not host or len(host) > 253:
        return None
    if not host.isascii():
        # Imported here: its tables cost ~1.3 MiB (USS) in init, which reads the configuration,
        # and nearly every name asked for is ASCII already.
        import idna

        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError:
            return None
    host = host.lower()
    labels = host.split(".")
    # A last label of digits is no DNS name (no top-level domain is numeric): it is an IP
    # spelling getaddrinfo would still accept (`127.1`, `2130706433`), or a range.
    if labels[-1].isdigit() or not all(_LABEL.match(label) for label in labels):
        return None
    return host


@dataclass(frozen=True)
class Pattern:
    """One allowed host: `host` exactly, or (`wildcard`) any name ending in `.host`."""

    text: str  # as written (normalised), the name /status and /metrics use
    host: str
    wildcard: bool
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        """`host` is normalised (`normalise_host`)."""
        if port not in self.ports:
            return False
        if self.wildcard:
            # `*.example.com` is the subdomains only: `example.com` itself is another entry.
            return host.endswith("." + self.host)
        return host == self.host


@dataclass(frozen=True)
class Allowlist:
    patterns: tuple[Pattern, ...]

    @property
    def texts(self) -> list[str]:
        return [p.text for p in self.patterns]

    def match(self, host: str, port: int) -> Pattern | None:
        """The first pattern allowing `host` (as asked for) on `port`, None when none does."""
        name = normalise_host(host)
        if name is None:
            return None
        return next((p for p in self.patterns if p.matches(name, port)), None)


def _port(var: str, raw: str, text: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        msg = f"{var}: pattern {text!r}: the port must be a number from 1 to 65535"
        raise AllowlistError(msg)
    return int(raw)


def _split_port(var: str, text: str) -> tuple[str, tuple[int, ...]]:
    """(host part, ports) of one pattern."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            msg = f"{var}: pattern {text!r}: an IPv6 address is written [addr] or [addr]:port"
            raise AllowlistError(msg)
        return f"[{host}]", (_port(var, rest[1:], text),) if rest else DEFAULT_PORTS
    if text.count(":") == 1:
        host, _, raw = text.partition(":")
        return host, (_port(var, raw, text),)
    return text, DEFAULT_PORTS  # no port, or a bare IPv6 address (no port then)


def parse_pattern(var: str, text: str) -> Pattern:
    """One pattern as written; AllowlistError naming `var` and the pattern and what is wrong."""

    def bad(why: str) -> AllowlistError:
        return AllowlistError(f"{var}: pattern {text!r}: {why}")

    if "://" in text:
        raise bad("no scheme: write the host only (api.example.com, not https://...)")
    if "/" in text:
        try:
            ipaddress.ip_network(text.replace("[", "").replace("]", ""), strict=False)
        except ValueError:
            raise bad("no path: write the host only, optionally with :port") from None
        raise bad("address ranges (CIDR) are not allowed: list host names or single addresses")
    host, ports = _split_port(var, text)
    wildcard = host.startswith("*.")
    rest = host[2:] if wildcard else host
    if host in ("*", "*.") or (wildcard and not rest.strip(".")):
        raise bad("a bare * would allow every host; unset the variable for an open network")
    if "*" in rest:
        raise bad("* is allowed only as a leading '*.' (*.example.com)")
    name = normalise_host(rest)
    if name is None:
        raise bad("not a host name or an IP address (ranges are not allowed)")
    if wildcard and is_ip(name):
        raise bad("'*.' takes a domain name, not an IP address")
    shown = f"[{name}]" if ":" in name else name
    shown = f"*.{shown}" if wildcard else shown
    if ports != DEFAULT_PORTS:
        shown = f"{shown}:{ports[0]}"
    return Pattern(text=shown, host=name, wildcard=wildcard, ports=ports)


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def parse_list(var: str, items: Iterable[str]) -> Allowlist:
    """The allowlist of `items` (patterns, blanks ignored). `none` alone is the empty list;
    nothing at all is an error (a variable set to nothing is more likely a mistake)."""
    texts = [t.strip() for t in items if t.strip()]
    if [t.lower() for t in texts] == [NONE]:
        return Allowlist(())
    if not texts:
        msg = f"{var} is empty; write {NONE!r} to allow no host, or unset it for an open network"
        raise AllowlistError(msg)
    if NONE in (t.lower() for t in texts):
        msg = f"{var}: {NONE!r} means no host at all and cannot stand beside patterns"
        raise AllowlistError(msg)
    if len(texts) > MAX_PATTERNS:
        msg = f"{var} has more than {MAX_PATTERNS} patterns"
        raise AllowlistError(msg)
    patterns: dict[str, Pattern] = {}
    for text in texts:
        pattern = parse_pattern(var, text)
        patterns.setdefault(pattern.text, pattern)  # a repeated pattern counts once
    return Allowlist(tuple(patterns.values()))


def split_value(raw: str) -> list[str]:
    """The patterns of `SIDECAR_EGRESS_ALLOW`: comma or whitespace separated."""
    return raw.replace(",", " ").split()


def split_file(text: str) -> list[str]:
    """The patterns of an allow file: one per line (or several, as in the variable); `#`
    starts a comment."""
    return [p for line in text.splitlines() for p in split_value(line.partition("#")[0])]


def read_file(source: str, path: str | Path) -> list[str]:
    """The patterns of the allow file at `path`: at most MAX_FILE bytes of UTF-8, else an
    AllowlistError that starts with `source` (what named the file) and says what is wrong."""
    try:
        data = read_limited(path, MAX_FILE)
    except OSError as exc:
        msg = f"{source}: cannot read {path}: {exc.strerror}"
        raise AllowlistError(msg) from None
    except TooBig:
        msg = f"{source}: {path} is larger than {MAX_FILE} bytes"
        raise AllowlistError(msg) from None
    try:
        return split_file(data.decode("utf-8"))
    except UnicodeDecodeError:
        msg = f"{source}: {path} is not UTF-8 text"
        raise AllowlistError(msg) from None
