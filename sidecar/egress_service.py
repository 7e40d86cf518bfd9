"""The sleeve's egress in the supervisor: the proxy for the allowlist (`sidecar.egress_proxy`)
on the loopback port the state file keeps, the proxy variables of the CLI's environment, and
what /status, /events, /metrics and the log say about allowed and refused attempts.

`Egress.denied(host, port, how)` is the one door for every refused attempt, the proxy's own
and the direct ones the enforcement sees, so that counting and rate limits live in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from sidecar.egress import Allowlist
from sidecar.egress_proxy import EgressProxy, Limits
from sidecar.events import EventBus
from sidecar.loopback import loopback_url
from sidecar.shapes import EgressDenied, EgressInfo

log = logging.getLogger(__name__)

How = Literal["proxy", "direct", "udp", "ipv6", "raw"]
HOWS: tuple[How, ...] = ("proxy", "direct", "udp", "ipv6", "raw")
QUIET = 60.0  # one event per (host, how), one log line per host, in this many seconds
MAX_REMEMBERED = 4096  # distinct hosts kept for the rate limits (an attacker picks names)
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
MAX_REPORT = 4096  # one refusal's datagram from the enforcement: {"host", "port", "how"}


def proxy_env(proxy: tuple[str, int], api: tuple[str, int]) -> dict[str, str]:
    """The variables that send the CLI's traffic to the proxy at `proxy`, except to the
    sidecar's API at `api` (named by address and port, never by a whole host: a bare
    127.0.0.1 would send every loopback connection around the proxy). Pure."""
    url = f"http://{proxy[0]}:{proxy[1]}"
    no_proxy = loopback_url(*api).removeprefix("http://")
    env = {name: url for name in PROXY_VARS}
    env |= {name.lower(): url for name in PROXY_VARS}
    env |= {"NO_PROXY": no_proxy, "no_proxy": no_proxy}
    # Node's own fetch and http ignore the variables unless told (Node >= 22.21 / 24.5; older
    # Nodes ignore this one, and CLIs that bundle their own proxy support read the rest).
    env["NODE_USE_ENV_PROXY"] = "1"
    return env


class _Limiter:
    """Whether a key was let through within the last `QUIET` seconds (bounded memory)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.last: dict[object, float] = {}
        self.pruned = -QUIET

    def due(self, key: object) -> bool:
        now = self.clock()
        if now - self.last.get(key, -QUIET) < QUIET:
            return False
        if len(self.last) >= MAX_REMEMBERED:
            if now - self.pruned >= 1.0:  # at most once a second: a flood must not cost O(n²)
                self.pruned = now
                self.last = {k: t for k, t in self.last.items() if now - t < QUIET}
            if len(self.last) >= MAX_REMEMBERED:
                return False  # a flood of distinct names: counted, not each one told
        self.last[key] = now
        return True


class Egress:
    """`allow` None: the network is open (no proxy, nothing in the CLI's environment)."""

    def __init__(
        self,
        allow: Allowlist | None,
        bus: EventBus,
        api: tuple[str, int],
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.allow = allow
        self.bus = bus
        self.api = api
        self.denied_total = 0
        self.denied_by_how: dict[str, int] = dict.fromkeys(HOWS, 0)
        self.allowed_by: dict[str, int] = {p.text: 0 for p in allow.patterns} if allow else {}
        self._events = _Limiter(clock)
        self._logs = _Limiter(clock)
        self.proxy: EgressProxy | None = None
        self._reports: socket.socket | None = None
        if allow is not None:
            api_host = loopback_url(*api).removeprefix("http://").rpartition(":")[0]
            self.proxy = EgressProxy(
                allow,
                also=((api_host.strip("[]"), api[1]),),
                on_denied=self.denied,
                on_allowed=self.allowed,
                limits=limits,
            )

    @property
    def mode(self) -> Literal["open", "allowlist"]:
        return "open" if self.allow is None else "allowlist"

    @property
    def port(self) -> int | None:
        """The proxy's port once it listens (kept in the state file across restarts)."""
        return self.proxy.address[1] if self.proxy is not None and self.started else None

    @property
    def started(self) -> bool:
        return self.proxy is not None and self.proxy.listening

    async def start(self, port: int | None) -> None:
        """Listen on 127.0.0.1:`port` (None: a port of the kernel's choosing, at a first
        start). A restarted supervisor binds the port the adopted CLI's environment names;
        OSError when it cannot (init's restart tries again: the CLI meanwhile reaches
        nothing, its enforcement allowing only this address)."""
        if self.proxy is not None:
            await self.proxy.start("127.0.0.1", port or 0)
            log.info("egress proxy on 127.0.0.1:%d for %s", self.proxy.address[1], self.texts)

    async def close(self) -> None:
        if self._reports is not None:
            asyncio.get_running_loop().remove_reader(self._reports.fileno())
            self._reports.close()
            self._reports = None
        if self.proxy is not None:
            await self.proxy.close()

    def listen_reports(self, path: Path, mode: int = 0o600) -> None:
        """Take the enforcement's reports of refused attempts: a unix datagram socket at
        `path` (made anew, `mode`), one JSON object `{"host", "port", "how"}` per datagram,
        each passed to `denied`. Malformed datagrams are dropped: the sender is the CLI's
        side, and a report costs it nothing but this count."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.bind(os.fspath(path))
        os.chmod(path, mode)
        self._reports = sock
        asyncio.get_running_loop().add_reader(sock.fileno(), self._read_reports)

    def _read_reports(self) -> None:
        assert self._reports is not None
        for _ in range(64):  # a burst is read in turns: the loop has other work
            try:
                data = self._reports.recv(MAX_REPORT)
            except (BlockingIOError, InterruptedError):
                return
            try:
                report = json.loads(data)
                host, port, how = report["host"], report["port"], report["how"]
            except (ValueError, TypeError, KeyError):
                continue
            if isinstance(host, str) and isinstance(port, int) and isinstance(how, str):
                self.denied(host[:253], port, how)

    @property
    def texts(self) -> list[str]:
        return self.allow.texts if self.allow is not None else []

    def env(self) -> dict[str, str]:
        """The CLI's proxy variables ({} with an open network)."""
        if self.proxy is None or not self.started:
            return {}
        return proxy_env(self.proxy.address, self.api)

    def allowed(self, pattern: str) -> None:
        self.allowed_by[pattern] = self.allowed_by.get(pattern, 0) + 1

    def denied(self, host: str, port: int, how: str) -> None:
        """A refused attempt of the CLI's (`how`: proxy, direct, udp, ipv6, raw): counted,
        an `egress-denied` event once per (host, how) a minute, a log line once per host."""
        self.denied_total += 1
        how_: How = how if how in HOWS else "direct"
        self.denied_by_how[how_] += 1
        if self._events.due((host, how_)):
            self.bus.publish(EgressDenied(host=host, port=port, how=how_))
        if self._logs.due(host):
            log.warning(
                "egress denied: %s port %d (%s); more for this host within %gs not logged",
                host,
                port,
                how_,
                QUIET,
            )

    def info(self) -> EgressInfo:
        return EgressInfo(mode=self.mode, allow=self.texts, denied=self.denied_total)
