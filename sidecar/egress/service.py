"""The sleeve's egress in the supervisor: the proxy for the allowlist (`sidecar.egress.proxy`)
on the loopback port the state file keeps, the proxy variables of the CLI's environment, the
list as it changes while the sleeve runs (`PATCH /egress`, an approval's remember, the allow
file read again on SIGHUP), and what /status, /events, /metrics, the audit trail and the log say
about allowed and refused attempts.

`Egress.denied(host, port, how)` is the one door for every refused attempt, the proxy's own
and the direct ones the enforcement sees, so that counting and rate limits live in one place;
`Egress.change` the one door for every change of the list.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, get_args

from sidecar.audit.records import EgressChangedRecord, EgressConnectionRecord
from sidecar.audit.trail import AuditTrail
from sidecar.core.contract import EgressHow, EgressMode
from sidecar.core.event_shapes import EgressChanged, EgressDenied
from sidecar.core.events import EventBus
from sidecar.core.layout import Layout
from sidecar.core.loopback import loopback_url
from sidecar.core.shapes import EgressAnswer, EgressInfo
from sidecar.egress.allowlist import MAX_PATTERNS, Allowlist, AllowlistError, parse_pattern
from sidecar.egress.fence import Fence
from sidecar.egress.guard import guard_argv
from sidecar.egress.peer import Peer, PeerFinder
from sidecar.egress.proxy import Ask, AskAnswer, Asked, EgressProxy
from sidecar.egress.reports import ReportListener
from sidecar.egress.sides import Limits
from sidecar.egress.substitute import Substitution
from sidecar.egress.terminate import prepare
from sidecar.security.acting import Owner, acting

log = logging.getLogger(__name__)

HOWS: tuple[EgressHow, ...] = get_args(EgressHow)
QUIET = 60.0  # one event per (host, how), one log line per host, in this many seconds
MAX_REMEMBERED = 4096  # distinct hosts kept for the rate limits (an attacker picks names)
MAX_LOOKUPS = 64  # connections waiting for their process to be looked up
PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
NO_PROXY = ("NO_PROXY", "no_proxy")
ChangedBy = Literal["api", "approval", "reload"]
NOT_HELD = (
    "refused at once: only requests through the egress proxy (HTTPS_PROXY) can wait for an "
    "approval; a connection around it cannot be held safely"
)


class NoAllowlist(Exception):
    """The sleeve's network is open: there is no list to change (409)."""


def proxy_env(proxy: tuple[str, int], api: tuple[str, int]) -> dict[str, str]:
    """The variables that send the CLI's traffic to the proxy at `proxy`, except to the
    sidecar's API at `api` (named by address and port, never by a whole host: a bare
    127.0.0.1 would send every loopback connection around the proxy). Pure."""
    url = f"http://{proxy[0]}:{proxy[1]}"
    no_proxy = loopback_url(*api).removeprefix("http://")
    env = {name: url for name in PROXY_VARS}
    env |= {name.lower(): url for name in PROXY_VARS}
    env |= dict.fromkeys(NO_PROXY, no_proxy)
    # Node's own fetch and http ignore the variables unless told (Node >= 22.21 / 24.5; older
    # Nodes ignore this one, and CLIs that bundle their own proxy support read the rest).
    env["NODE_USE_ENV_PROXY"] = "1"
    return env


def no_proxy_with(env: Mapping[str, str], address: tuple[str, int]) -> dict[str, str]:
    """NO_PROXY and no_proxy of the proxy variables `env` with `address` (a loopback server
    of the CLI's own, reached around the proxy) added: by address and port, as the API's. Pure."""
    added = loopback_url(*address).removeprefix("http://")
    return {name: f"{env[name]},{added}" if env.get(name) else added for name in NO_PROXY}


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
    """`allow` None: the network is open (no proxy, nothing in the CLI's environment).
    `audit`: where connections and changes are recorded; `owner`: the CLI's user, as whom the
    process behind a connection is looked up."""

    def __init__(
        self,
        allow: Allowlist | None,
        bus: EventBus,
        api: tuple[str, int],
        *,
        limits: Limits | None = None,
        clock: Callable[[], float] = time.monotonic,
        audit: AuditTrail | None = None,
        owner: Owner | None = None,
        ask_seconds: float | None = None,
        secrets: Substitution | None = None,
    ) -> None:
        self.allow = allow  # the list as the proxy applies it now
        self.added: list[str] = []  # patterns added while the sleeve runs
        self.bus = bus
        self.api = api
        self.audit = audit
        self.owner = owner
        self.ask_seconds = ask_seconds
        # The secrets' placeholders swapped for their values (`sidecar.egress.substitute`).
        self.secrets = secrets
        self.asked = 0
        self._peers = PeerFinder()
        self._finder = ThreadPoolExecutor(1, thread_name_prefix="egress-peer")
        self._lookups = 0
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
                on_closed=self.closed if audit is not None else None,
                find_peer=self.find_peer,
                secrets=secrets,
                unlisted=secrets.scan if secrets is not None else None,
            )

    async def terminate_tls(self, layout: Layout, ca_file: Path | None) -> dict[str, str]:
        """With secrets: the sleeve's CA made (or the kept one reused), the proxy terminating
        TLS for the hosts they go to, and the CLI's variables that make it trust that CA ({}
        without secrets). Before the CLI's guard: its fence grants only the files there then."""
        if self.proxy is None or self.secrets is None:
            return {}
        hosts = {
            f"*.{p.host}" if p.wildcard else p.host for s in self.secrets.swaps for p in s.hosts
        }
        self.proxy.termination, trust = await prepare(layout, hosts, ca_file)
        return trust

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
        self._finder.shutdown(wait=False, cancel_futures=True)

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
        own: tuple[str, int] | None = None,
        *,
        deny_unix: tuple[Path, ...],
        fence: Fence,
        env_file: Path,
    ) -> tuple[str, ...]:
        """The argv that runs `argv` with its network closed but for the proxy and the API
        (`argv` itself with an open network), and `own`: the loopback address of the CLI's
        own server for this launch (opencode's, on a port the sidecar picked), when it has
        one. `deny_unix`: sockets leading to processes outside the guard (the sidecar's tmux
        and ttyd); `fence`: the files it keeps the CLI from; `env_file`: the CLI's own
        variables, for the CLI alone."""
        if self.proxy is None or not self.started:
            return argv
        allowed = [self.proxy.address, self.api_address, *([own] if own is not None else [])]
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
        an `egress-denied` event once per (host, how) a minute (a refusal around the proxy
        recorded in the audit trail with it), a log line once per host."""
        self.denied_total += 1
        how_: EgressHow = how if how in HOWS else "direct"
        self.denied_by_how[how_] += 1
        if self._events.due((host, how_)):
            event = EgressDenied(host=host, port=port, how=how_)
            if how_ != "proxy" and self.ask_seconds is not None:
                event.reason = NOT_HELD
            self.bus.publish(event)
            if how_ != "proxy" and self.audit is not None:  # the proxy records its own
                record = EgressConnectionRecord(host=host, port=port, how=how_, allowed=False)
                self.audit.write(record, lazy=True)
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

    def answer(self) -> EgressAnswer:
        """GET /egress."""
        return EgressAnswer(
            mode=self.mode,
            allow=self.texts,
            denied=self.denied_total,
            added=list(self.added),
            allowed=dict(self.allowed_by),
            asked=self.asked,
            ask=self.ask_seconds,
        )

    # ---- the process behind a connection, and its record ---------------------------------------

    async def find_peer(
        self, client: tuple[str, int], server: tuple[str, int], argv: bool
    ) -> Peer | None:
        """The process that opened a connection to the proxy (in a thread of its own, as the
        CLI's user: the kernel shows a process's descriptors only to its own user). A thread
        of its own, one look at a time: a burst of connections never keeps the loop's other
        work (name lookups, the audit trail's writes) waiting; past MAX_LOOKUPS waiting, the
        process is not looked for (its record says none)."""
        if self._lookups >= MAX_LOOKUPS:
            return None

        def find() -> Peer | None:
            with acting(self.owner):
                return self._peers.find(client, server, argv=argv)

        self._lookups += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._finder, find)
        finally:
            self._lookups -= 1

    def closed(self, record: EgressConnectionRecord) -> None:
        if self.audit is not None:
            self.audit.write(record, lazy=True)  # nobody waits on it: batched

    def use_asker(self, ask: Ask) -> None:
        """Hold requests for hosts off the list while `ask` decides (SIDECAR_EGRESS_ASK)."""

        async def counted(asked: Asked) -> AskAnswer:
            self.asked += 1
            return await ask(asked)

        if self.proxy is not None:
            self.proxy.ask = counted

    # ---- the list while the sleeve runs --------------------------------------------------------

    def change(
        self, add: Iterable[str], remove: Iterable[str], by: ChangedBy
    ) -> EgressChanged | None:
        """Add and take off patterns (as written; checked as at start, all before anything
        changes: AllowlistError names the first bad one). Connections open under a pattern
        taken off whose host the list no longer allows are closed. None: nothing changed."""
        if self.allow is None or self.proxy is None:
            msg = (
                "the sleeve's network is open (SIDECAR_EGRESS_ALLOW is not set): no list to change"
            )
            raise NoAllowlist(msg)
        adding = [parse_pattern("add", text) for text in add]
        current = {p.text: p for p in self.allow.patterns}
        removing = []
        for text in remove:
            pattern = parse_pattern("remove", text)
            if pattern.text not in current:
                msg = f"remove: {pattern.text!r} is not on the list (GET /egress lists it)"
                raise AllowlistError(msg)
            removing.append(pattern.text)
        kept = {t: p for t, p in current.items() if t not in removing}
        new = [p for p in adding if p.text not in kept]
        kept |= {p.text: p for p in new}
        if len(kept) > MAX_PATTERNS:
            msg = f"the list would hold more than {MAX_PATTERNS} patterns"
            raise AllowlistError(msg)
        added = list(dict.fromkeys(p.text for p in new))
        if not added and not removing:
            return None
        return self._apply(Allowlist(tuple(kept.values())), added, removing, by)

    def replace(self, allow: Allowlist) -> EgressChanged | None:
        """SIGHUP: the allow file's list, plus what was added at run time and is still wanted
        (patterns added with PATCH /egress or remembered stay)."""
        if self.allow is None:
            return None
        current = set(self.allow.texts)
        kept = {p.text: p for p in allow.patterns}
        for text in self.added:
            kept.setdefault(text, parse_pattern("added", text))
        removed = [t for t in self.allow.texts if t not in kept]
        added = [t for t in kept if t not in current]
        if not added and not removed:
            return None
        return self._apply(Allowlist(tuple(kept.values())), added, removed, "reload")

    def _apply(
        self, allow: Allowlist, added: list[str], removed: list[str], by: ChangedBy
    ) -> EgressChanged:
        assert self.proxy is not None
        self.allow = allow
        self.proxy.allow = allow
        if by != "reload":
            self.added = [t for t in [*self.added, *added] if t not in removed]
        for text in added:
            self.allowed_by.setdefault(text, 0)
        for text in removed:
            self.allowed_by.pop(text, None)
        closed = self.proxy.close_unlisted(removed)
        log.info("egress allowlist changed by %s: +%s -%s (%d closed)", by, added, removed, closed)
        event = EgressChanged(added=added, removed=removed, by=by, allow=allow.texts, closed=closed)
        self.bus.publish(event)
        if self.audit is not None:
            self.audit.write(
                EgressChangedRecord(added=added, removed=removed, by=by, allow=allow.texts)
            )
        return event
