"""`GET /metrics` in the Prometheus text format: the CLI, ttyd, resleeves, exits, message depth,
`/events` clients and HTTP requests by route and status class, plus the process's own metrics.

prometheus-client, not exposition by hand: measured here it adds 0.6 MiB USS after aiohttp
(against the 45 MiB budget), and it brings the exact text format (escaping, HELP/TYPE lines)
and the process collector. Nothing on a request path touches it: requests are counted in a
plain dict (`RequestCounter`), and the families are built from the supervisor's state only
when Prometheus scrapes.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from sidecar import __version__
from sidecar.mailbox import Mailbox, NeedlecastError
from sidecar.states import ProcState
from sidecar.supervisor import Supervisor

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
PROC_STATES = [s.value for s in ProcState]


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
        for (resource, method, status), n in list(self.counts.items()):
            route = resource.canonical if resource is not None else "unmatched"
            out[(route, method, f"{status // 100}xx")] += n
        return out


@dataclass
class Depths:
    inbox: int | None
    outbox: int | None


def _count(mailbox: Mailbox) -> int | None:
    try:
        return len(mailbox.read().messages)
    except (OSError, NeedlecastError):  # unreadable, or a symlink out of the workspace
        return None


def _one_hot(name: str, doc: str, current: str, values: list[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["state"])
    for value in values:
        family.add_metric([value], 1.0 if value == current else 0.0)
    return family


class SidecarCollector(Collector):
    """The sidecar's own families, from the supervisor's in-memory state at scrape time."""

    def __init__(self, sup: Supervisor, requests: RequestCounter) -> None:
        self.sup = sup
        self.requests = requests
        self.depths = Depths(None, None)

    def collect(self) -> Iterator[Metric]:
        sup, stats = self.sup, self.sup.stats
        info = GaugeMetricFamily(
            "sidecar_info", "The sleeve and its CLI", labels=["sleeve_id", "cli", "version"]
        )
        info.add_metric([sup.config.sleeve_name, sup.cli_name, __version__], 1.0)
        yield info
        yield GaugeMetricFamily(
            "sidecar_uptime_seconds",
            "Seconds since the sidecar started",
            value=time.monotonic() - sup.started,
        )
        yield GaugeMetricFamily(
            "sidecar_cli_up",
            "1 while the CLI runs (what /health calls healthy)",
            value=1.0 if sup.healthy else 0.0,
        )
        yield _one_hot(
            "sidecar_cli_state", "The CLI's process state", sup.cli.state.value, PROC_STATES
        )
        yield _one_hot(
            "sidecar_ttyd_state", "ttyd's process state", sup.ttyd.status.state.value, PROC_STATES
        )
        exits = CounterMetricFamily(
            "sidecar_cli_exits",
            "CLI exits the sidecar did not cause, by exit code",
            labels=["code"],
        )
        for code, n in sorted(stats.cli_exits.items()):
            exits.add_metric([code], n)
        yield exits
        yield CounterMetricFamily(
            "sidecar_cli_restarts", "CLI starts by the restart policy", value=stats.cli_restarts
        )
        yield CounterMetricFamily(
            "sidecar_tmux_heals", "tmux servers recreated after dying", value=stats.tmux_heals
        )
        # Kept by init, so it survives the crashes it counts (the counters above start over
        # with each supervisor, which Prometheus reads as a counter reset).
        yield CounterMetricFamily(
            "sidecar_supervisor_restarts",
            "Supervisor crashes init recovered from (it started the supervisor again)",
            value=sup.restarts,
        )
        yield SummaryMetricFamily(
            "sidecar_resleeve_duration_seconds",
            "Finished resleeves: from the request to the new CLI running",
            count_value=stats.resleeves,
            sum_value=stats.resleeve_seconds,
        )
        yield GaugeMetricFamily(
            "sidecar_resleeving", "1 while a resleeve runs", value=1.0 if sup.resleeving else 0.0
        )
        for box, depth in (("inbox", self.depths.inbox), ("outbox", self.depths.outbox)):
            if depth is not None:
                yield GaugeMetricFamily(
                    f"sidecar_{box}_messages", f"Messages in .needlecast/{box}.md", value=depth
                )
        yield GaugeMetricFamily(
            "sidecar_events_clients", "Open /events streams", value=sup.bus.subscribers
        )
        http = CounterMetricFamily(
            "sidecar_http_requests",
            "HTTP requests answered, by route, method and status class",
            labels=["route", "method", "code"],
        )
        for (route, method, code), n in sorted(self.requests.by_label().items()):
            http.add_metric([route, method, code], n)
        yield http


class Metrics:
    """The registry behind `/metrics`: our collector plus the process's own metrics."""

    def __init__(
        self, sup: Supervisor, requests: RequestCounter, inbox: Mailbox, outbox: Mailbox
    ) -> None:
        self.mailboxes = (inbox, outbox)
        self.collector = SidecarCollector(sup, requests)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)

    async def handle(self, request: web.Request) -> web.Response:
        # The message files are read (a stat, and a parse only when one changed) in a worker
        # thread, like every message route; the rest is in-memory state.
        inbox, outbox = await asyncio.gather(
            *(asyncio.to_thread(_count, box) for box in self.mailboxes)
        )
        self.collector.depths = Depths(inbox, outbox)
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE}
        )
