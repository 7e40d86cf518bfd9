"""Where a process on this machine reaches the sidecar's API, given the address it is bound to:
one answer for the CLI's hooks and for the `sidecar` client commands; and free ports for a
server that something else starts a moment later. Standard library only (the client imports
it)."""

from __future__ import annotations

import contextlib
import ipaddress
import random
import socket
from pathlib import Path

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
RESERVED = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")
FIRST_PORT = 1024  # below: privileged
TRIES = 200


def loopback_url(host: str, port: int | str) -> str:
    """`http://ADDRESS:PORT` for a server bound to `host`. A wildcard bind (0.0.0.0, ::) is
    reached through its own family's loopback address (`::` may be IPv6 only), `localhost` as
    127.0.0.1 (an address: no resolver that might answer ::1 first), any other address as it
    is; an IPv6 address goes into brackets."""
    if host == "localhost":
        host = "127.0.0.1"
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None  # a name: reached as it is
        if address is not None and address.is_unspecified:
            host = "::1" if address.version == 6 else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _ephemeral() -> range:
    """The kernel's ephemeral port range ("32768\t60999"); Linux's default if unreadable."""
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, EPHEMERAL.read_text().split())
        return range(low, high + 1)
    return range(32768, 61000)


def _reserved() -> set[int]:
    """The ports the administrator reserved ("8080,9000-9010"; often empty)."""
    out: set[int] = set()
    with contextlib.suppress(OSError, ValueError):
        for span in filter(None, RESERVED.read_text().strip().split(",")):
            low, _, high = span.partition("-")
            out.update(range(int(low), int(high or low) + 1))
    return out


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports nothing is bound to on `host` now, for servers that bind them a
    moment later. Each is picked outside the kernel's ephemeral range: a port from that range
    (what binding port 0 gives) can become the source port of any outgoing connection before
    the server binds it, and the server then fails with "address in use". All the probes stay
    bound until every port is picked, so no two are the same. A machine whose ephemeral range
    leaves no room gets ports from it after all (bound to port 0)."""
    ephemeral, reserved = _ephemeral(), _reserved()
    room = [p for p in range(FIRST_PORT, 65536) if p not in ephemeral and p not in reserved]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    picked: list[int] = []
    with contextlib.ExitStack() as stack:
        for candidate in random.sample(room, min(len(room), TRIES + count)):
            if len(picked) == count:
                break
            probe = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
            picked.append(candidate)
        while len(picked) < count:  # no room outside the ephemeral range
            probe = stack.enter_context(socket.socket(family, socket.SOCK_STREAM))
            probe.bind((host, 0))
            picked.append(int(probe.getsockname()[1]))
    return picked


def free_port(host: str = "127.0.0.1") -> int:
    """One port of `free_ports`."""
    return free_ports(1, host)[0]
