"""Where a process on this machine reaches the sidecar's API, given the address it is bound to:
one answer for the CLI's hooks and for the `sidecar` client commands. Standard library only (the
client imports it)."""

from __future__ import annotations

import ipaddress


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
