"""The sleeve's egress in the supervisor: the proxy for the allowlist (`sidecar.egress.proxy`)
on the loopback port the state file keeps, the proxy variables of the CLI's environment, and
what /status, /events, /metrics and the log say about allowed and refused attempts.

`Egress.denied(host, port, how)` is the one door for every refused attempt, the proxy's own
and the direct ones the enforcement sees, so that counting and rate limits live in one place.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import get_args

from sidecar.core.contract import EgressHow, EgressMode
from sidecar.core.event_shapes import EgressDenied
from sidecar.core.events import EventBus
from sidecar.core.loopback import loopback_url
from sidecar.core.shapes import EgressInfo
from sidecar.egress.allowlist import Allowlist
from sidecar.egress.fence import Fence
from sidecar.egress.guard import guard_argv
from sidecar.egress.proxy import EgressProxy, Limits
from sidecar.egress.reports import ReportListener

log = logging.getLogger(__name__)

HOWS: tuple[EgressHow, ...] = get_args(EgressHow)
QUIET = 60.0  # one event per (host, how), one log line per host, in this many seconds
MAX_REMEMBERED = 4096  # distinct hosts kept for the rate limits (an attacker picks names)
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


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
        self._reports: ReportListener | None = None
        self.report_path: Path | None = None
        if allow is not None:
            self.proxy = EgressProxy(
                allow,
                also=(self.api_address,),
                on_denied=self.denied,
                on_allowed=self.allowed,
                limits=limits,
            )

    @property
    def api_address(self) -> tuple[str, int]:
        """Where a local process reaches the sidecar's API (hooks)."""
        host = loopback_url(*self.api).removeprefix("http://").rpartition(":")[0]
        return host.strip("[]"), self.api[1]

    @property
    def mode(self) -> EgressMode:
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
            self._reports.close()
            self._reports = None
        if self.proxy is not None:
            await self.proxy.close()

    def listen_reports(
        self, path: Path, sender: Callable[[int, int], bool], group: int | None = None
    ) -> None:
        """Take the broker's reports of refused attempts (`sidecar.egress.reports`) on a unix
        datagram socket at `path`, from the process `sender(pid, uid)` accepts; `group`: the
        CLI user's, whose broker sends."""
        self._reports = ReportListener.open(
            path, self.denied, sender=sender, hows=HOWS, group=group
        )
        self.report_path = path

    def guard(
        self,
        argv: tuple[str, ...],
        *,
        deny_unix: tuple[Path, ...],
        fence: Fence,
        env_file: Path,
    ) -> tuple[str, ...]:
        """The argv that runs `argv` with its network closed but for the proxy and the API
        (`argv` itself with an open network). `deny_unix`: sockets leading to processes
        outside the guard (the sidecar's tmux and ttyd); `fence`: the files it keeps the CLI
        from; `env_file`: the CLI's own variables, for the CLI alone."""
        if self.proxy is None or not self.started:
            return argv
        allowed = [self.proxy.address, self.api_address]
        return guard_argv(
            argv, allowed, self.report_path, deny_unix=deny_unix, fence=fence, env_file=env_file
        )

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
        """A refused attempt of the CLI's (`how`: an EgressHow, else counted as direct): counted,
        an `egress-denied` event once per (host, how) a minute, a log line once per host."""
        self.denied_total += 1
        how_: EgressHow = how if how in HOWS else "direct"
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
