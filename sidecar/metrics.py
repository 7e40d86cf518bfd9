"""`GET /metrics` in the Prometheus text format (0.0.4): the CLI, ttyd, resleeves, exits,
message depth, `/events` clients and HTTP requests by route and status class, plus the process's
own `process_*` metrics.

Written by hand, not with prometheus-client (which the tests use to parse it): measured here,
the library's `generate_latest` alone takes 166 us per scrape for these families (a bare aiohttp
hello world answers in ~30 us of CPU), which caps /metrics far below its target of 0.3x a hello
world's rate, and it costs 0.6 MiB USS more. The format is small and stable: `# HELP`/`# TYPE`
lines, then `name{label="value"} number`. Nothing on a request path touches this module but
`RequestCounter.count`, a dict add; the families are built only when Prometheus scrapes.
"""

from __future__ import annotations

import asyncio
import functools
import os
import resource
import time
from collections import Counter
from collections.abc import Iterable, Mapping

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource

from sidecar import __version__
from sidecar.contract import AGENT_STATES
from sidecar.mailbox import Mailbox, NeedlecastError
from sidecar.proc import start_time
from sidecar.states import ProcState
from sidecar.supervisor import Supervisor

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROC_STATES = tuple(s.value for s in ProcState)
FD_COUNT_EVERY = 1.0  # seconds: listing /proc/self/fd costs ~35 us with 60 fds open
Labels = tuple[tuple[str, str], ...]


class RequestCounter:
    """HTTP requests by route, method and status, counted when an answer's headers go out
    (`count`, called from `on_response_prepare`: every answer, errors and streams included).
    The key is the route's resource object, the method and the status: a dict add per
    request, with labels made only at scrape time. Routes outside the table are `unmatched`,
    so a scan of random URLs cannot grow the label set."""

    def __init__(self) -> None:
        self.counts: dict[tuple[AbstractResource | None, str, int], int] = {}

    def count(self, request: web.Request, response: web.StreamResponse) -> None:
        key = (request.match_info.route.resource, request.method, response.status)
        self.counts[key] = self.counts.get(key, 0) + 1

    def by_label(self) -> Counter[tuple[str, str, str]]:
        """{(route, method, status class): count}."""
        out: Counter[tuple[str, str, str]] = Counter()
        for key, n in list(self.counts.items()):
            out[_request_labels(*key)] += n
        return out


@functools.lru_cache(maxsize=1024)  # bounded: the route table's resources, methods, statuses
def _request_labels(
    resource: AbstractResource | None, method: str, status: int
) -> tuple[str, str, str]:
    route = resource.canonical if resource is not None else "unmatched"
    return route, method, f"{status // 100}xx"


# ---- the text format ---------------------------------------------------------------------------


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


@functools.cache
def _header(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}"


@functools.cache
def _one_prefix(name: str, kind: str, doc: str) -> str:
    return f"{_header(name, kind, doc)}\n{name} "


@functools.lru_cache(maxsize=1024)  # bounded sets: states, routes, exit codes, CLI names
def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """`name{label="value",...}`, escaped as the format wants."""
    pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels)
    return f"{name}{{{pairs}}}"


@functools.cache
def _one_hot_lines(name: str, current: str, values: tuple[str, ...]) -> str:
    return "\n".join(f"{_series(name, (('state', v),))} {int(v == current)}" for v in values)


class Exposition:
    """Families in the order they are added, rendered to the text format. What does not change
    between scrapes (headers, label sets, the series of a state) is made once and reused."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, doc: str, samples: Iterable[tuple[Labels, float]]
    ) -> None:
        """A family with labelled samples (`Labels`: (name, value) pairs, in order)."""
        self.lines.append(_header(name, kind, doc))
        self.lines.extend(f"{_series(name, labels)} {_number(value)}" for labels, value in samples)

    def one(self, name: str, kind: str, doc: str, value: float) -> None:
        """A family of one sample without labels."""
        self.lines.append(_one_prefix(name, kind, doc) + _number(value))

    def one_hot(self, name: str, doc: str, current: str, values: tuple[str, ...]) -> None:
        """A state as one gauge series per possible value, 1 for the current one."""
        self.lines.append(_header(name, "gauge", doc))
        self.lines.append(_one_hot_lines(name, current, values))

    def render(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


# ---- the process's own metrics -----------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


class _FdCount:
    """Open file descriptors, counted at most once per FD_COUNT_EVERY: the count moves slowly
    and listing /proc/self/fd is the dearest part of a scrape."""

    def __init__(self) -> None:
        self.value, self.at = 0, -FD_COUNT_EVERY

    def __call__(self) -> int:
        now = time.monotonic()
        if now - self.at >= FD_COUNT_EVERY:
            self.value, self.at = len(os.listdir("/proc/self/fd")), now
        return self.value


_fd_count = _FdCount()


class _Statm:
    """/proc/self/statm, read with one `pread` on a descriptor kept open (the kernel makes the
    text anew on every read from offset 0): an open, read and close per scrape cost more than
    the rest of the process metrics together."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def __call__(self) -> list[bytes]:
        if self.fd is None:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self.fd, 256, 0).split()


_statm = _Statm()


def process_metrics(out: Exposition, started: float) -> None:
    """What prometheus-client's process collector gives, from `os.times`, one read of
    /proc/self/statm and a (cached) listing of /proc/self/fd."""
    cpu = os.times()
    out.one(
        "process_cpu_seconds_total", "counter", "User and system CPU time", cpu.user + cpu.system
    )
    size, resident = _statm()[:2]
    out.one("process_virtual_memory_bytes", "gauge", "Virtual memory size", int(size) * _PAGE)
    out.one("process_resident_memory_bytes", "gauge", "Resident memory", int(resident) * _PAGE)
    out.one("process_start_time_seconds", "gauge", "Start time since the epoch", started)
    out.one("process_open_fds", "gauge", "Open file descriptors", _fd_count())
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    out.one("process_max_fds", "gauge", "Limit on open file descriptors", soft)


# ---- the sidecar's families ---------------------------------------------------------------------


def _depth(mailbox: Mailbox) -> int | None:
    try:
        return len(mailbox.read().messages)
    except (OSError, NeedlecastError):  # unreadable, or a symlink out of the workspace
        return None


class Metrics:
    """The handler behind `/metrics`: the supervisor's in-memory state at scrape time."""

    def __init__(
        self, sup: Supervisor, requests: RequestCounter, inbox: Mailbox, outbox: Mailbox
    ) -> None:
        self.sup = sup
        self.requests = requests
        self.mailboxes = {"inbox": inbox, "outbox": outbox}
        ticks = start_time(os.getpid())  # seconds after boot, as the kernel counts them
        self.started = _boot_time() + ticks if ticks is not None else time.time()
        self._depths: dict[str, int | None] = dict.fromkeys(self.mailboxes)
        self._reading: set[str] = set()

    async def depths(self) -> dict[str, int | None]:
        """Messages per mailbox: from the last parse when the file is unchanged (a stat), else
        read in a worker thread like every message route (it takes the file lock) — one read
        per mailbox at a time: scrapes that come while one runs take the last count (a file
        that keeps changing must not cost a parse per scrape, nor a parse's memory per
        scrape in flight)."""
        for name, box in self.mailboxes.items():
            peeked = box.peek()
            if peeked is not None:
                self._depths[name] = len(peeked.messages)
            elif name not in self._reading:
                self._reading.add(name)
                try:
                    self._depths[name] = await asyncio.to_thread(_depth, box)
                finally:
                    self._reading.discard(name)
        return dict(self._depths)

    def exposition(self, depths: Mapping[str, int | None]) -> Exposition:
        sup, stats = self.sup, self.sup.stats
        out = Exposition()
        out.family(
            "sidecar_info",
            "gauge",
            "The sleeve and its CLI",
            [
                (
                    (
                        ("sleeve_id", sup.config.sleeve_name),
                        ("cli", sup.cli_name),
                        ("version", __version__),
                    ),
                    1,
                )
            ],
        )
        out.one(
            "sidecar_uptime_seconds",
            "gauge",
            "Seconds since the sidecar started",
            round(time.monotonic() - sup.started, 3),
        )
        out.one(
            "sidecar_cli_up", "gauge", "1 while the CLI runs (/health: healthy)", int(sup.healthy)
        )
        out.one_hot(
            "sidecar_cli_state", "The CLI's process state", sup.cli.state.value, PROC_STATES
        )
        out.one_hot(
            "sidecar_ttyd_state", "ttyd's process state", sup.ttyd.status.state.value, PROC_STATES
        )
        agent = sup.awareness.machine
        out.one_hot(
            "sidecar_agent_state",
            "What the agent is doing (working, waiting for a person, idle, ...)",
            agent.state,
            AGENT_STATES,
        )
        out.family(
            "sidecar_agent_state_seconds_total",
            "counter",
            "Seconds the agent has spent in each state since the supervisor started",
            [((("state", name),), round(t, 3)) for name, t in agent.seconds_in_states().items()],
        )
        out.family(
            "sidecar_cli_exits_total",
            "counter",
            "CLI exits the sidecar did not cause, by exit code",
            [((("code", code),), n) for code, n in sorted(stats.cli_exits.items())],
        )
        out.one(
            "sidecar_supervisor_restarts_total",
            "counter",
            "Supervisors started again by init after a crash",
            sup.restarts,
        )
        out.one(
            "sidecar_cli_restarts_total",
            "counter",
            "CLI starts by the restart policy",
            stats.cli_restarts,
        )
        out.one(
            "sidecar_tmux_heals_total",
            "counter",
            "tmux servers recreated after dying",
            stats.tmux_heals,
        )
        out.family(
            "sidecar_resleeve_duration_seconds",
            "summary",
            "Finished resleeves: from the request to the new CLI running",
            [],
        )
        out.lines.append(f"sidecar_resleeve_duration_seconds_count {stats.resleeves}")
        out.lines.append(f"sidecar_resleeve_duration_seconds_sum {stats.resleeve_seconds!r}")
        out.one("sidecar_resleeving", "gauge", "1 while a resleeve runs", int(sup.resleeving))
        for name, depth in depths.items():
            if depth is not None:
                out.one(
                    f"sidecar_{name}_messages", "gauge", f"Messages in .needlecast/{name}.md", depth
                )
        out.one("sidecar_events_clients", "gauge", "Open /events streams", sup.bus.subscribers)
        out.family(
            "sidecar_http_requests_total",
            "counter",
            "HTTP requests answered, by route, method and status class",
            [
                ((("route", route), ("method", method), ("code", code)), n)
                for (route, method, code), n in sorted(self.requests.by_label().items())
            ],
        )
        process_metrics(out, self.started)
        return out

    async def handle(self, request: web.Request) -> web.Response:
        body = self.exposition(await self.depths()).render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
