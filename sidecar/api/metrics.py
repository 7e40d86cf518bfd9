"""`GET /metrics`: the sidecar's own families (the CLI, ttyd, the agent, resleeves, exits,
message depth, `/events` clients, HTTP requests by route and status class, egress) from one
snapshot of the supervisor, written with `sidecar.api.prometheus`. Only `RequestCounter.count` runs
per request.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Mapping

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource

from sidecar import __version__
from sidecar.agent.approvals import Approvals
from sidecar.api import view
from sidecar.api.prometheus import CONTENT_TYPE, Exposition, process_metrics, process_start
from sidecar.api.view import SupervisorView
from sidecar.core.contract import AGENT_STATES
from sidecar.core.shapes import UsageInfo
from sidecar.core.states import ProcState
from sidecar.process.supervisor import Supervisor
from sidecar.usage.reports import KINDS
from sidecar.workspace.mailbox import Mailbox, NeedlecastError

PROC_STATES = tuple(s.value for s in ProcState)


class RequestCounter:
    """HTTP requests by route, method and status (`count`, called by the API's outermost
    middleware for every answer, errors and streams included).
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


# ---- the sidecar's families ---------------------------------------------------------------------


def _depth(mailbox: Mailbox) -> int | None:
    try:
        return len(mailbox.read().messages)
    except (OSError, NeedlecastError):  # unreadable, or a symlink out of the workspace
        return None


def approvals(out: Exposition, book: Approvals) -> None:
    """The agent's permission requests: asked, answered (by decision and who, and the policy's
    by rule), waiting, and the seconds from a request to its answer."""
    out.one("sidecar_approvals_requested_total", "counter", "Permission requests", book.requested)
    out.family(
        "sidecar_approvals_decided_total",
        "counter",
        "Permission requests answered, by decision and by whom (api, terminal, timeout, link, "
        "policy)",
        [
            ((("decision", decision), ("by", by)), book.decided[decision, by])
            for decision in ("allow", "deny")
            for by in ("api", "terminal", "timeout", "link", "policy")
        ],
    )
    out.family(
        "sidecar_policy_decisions_total",
        "counter",
        "Requests the policy decided, by rule and decision (the rules are the policy file's)",
        [
            ((("rule", rule), ("decision", decision)), n)
            for (rule, decision), n in sorted(book.by_rule.items())
        ],
    )
    out.one(
        "sidecar_approvals_pending", "gauge", "Permission requests waiting now", len(book.pending())
    )
    out.summary(
        "sidecar_approval_wait_seconds",
        "Seconds from a permission request to its answer",
        sum(book.decided.values()),
        round(book.wait_seconds, 3),
    )


def usage(out: Exposition, spent: UsageInfo) -> None:
    """What the agent spent, per model, as its CLI reported it."""
    models = sorted(spent.by_model.items())
    out.family(
        "sidecar_tokens_total",
        "counter",
        "Tokens of the agent's model requests, by type (input, output, cache_read, "
        "cache_creation) and model",
        [
            ((("type", kind), ("model", model)), getattr(counts, f"{kind}_tokens"))
            for model, counts in models
            for kind in KINDS
        ],
    )
    out.family(
        "sidecar_cost_usd_total",
        "counter",
        "US dollars of the agent's model requests, by model (the CLI's figure, else the "
        "sidecar's price table)",
        [((("model", model),), counts.cost_usd) for model, counts in models],
    )


# Always present, 0 until they happen, so that an alert on a crash sees the series from the start.
TMUX_DEATH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGKILL", "SIGTERM")


def tmux_deaths(seen: tuple[tuple[str, int], ...]) -> list[tuple[str, int]]:
    counts = dict.fromkeys(TMUX_DEATH_SIGNALS, 0)
    counts.update(seen)
    return sorted(counts.items())


class Metrics:
    """The handler behind `/metrics`: the supervisor's in-memory state at scrape time."""

    def __init__(
        self, sup: Supervisor, requests: RequestCounter, inbox: Mailbox, outbox: Mailbox
    ) -> None:
        self.sup = sup
        self.requests = requests
        self.mailboxes = {"inbox": inbox, "outbox": outbox}
        self.started = process_start()
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

    def exposition(self, v: SupervisorView, depths: Mapping[str, int | None]) -> Exposition:
        out = Exposition()
        out.family(
            "sidecar_info",
            "gauge",
            "The sleeve and its CLI",
            [
                (
                    (
                        ("sleeve_id", self.sup.config.sleeve_name),
                        ("cli", v.cli_name),
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
            round(v.uptime, 3),
        )
        out.one(
            "sidecar_cli_up", "gauge", "1 while the CLI runs (/health: healthy)", int(v.healthy)
        )
        out.one_hot("sidecar_cli_state", "The CLI's process state", v.cli.state.value, PROC_STATES)
        out.one_hot("sidecar_ttyd_state", "ttyd's process state", v.ttyd.state.value, PROC_STATES)
        out.one_hot(
            "sidecar_agent_state",
            "What the agent is doing (working, waiting for a person, idle, ...)",
            v.agent.state,
            AGENT_STATES,
        )
        out.family(
            "sidecar_agent_state_seconds_total",
            "counter",
            "Seconds the agent has spent in each state since the supervisor started",
            [((("state", name),), round(t, 3)) for name, t in v.agent_seconds().items()],
        )
        out.family(
            "sidecar_cli_exits_total",
            "counter",
            "CLI exits the sidecar did not cause, by exit code",
            [((("code", code),), n) for code, n in sorted(v.cli_exits)],
        )
        out.one(
            "sidecar_supervisor_restarts_total",
            "counter",
            "Supervisors started again by init after a crash",
            v.restarts,
        )
        out.one(
            "sidecar_cli_restarts_total",
            "counter",
            "CLI starts by the restart policy",
            v.cli_restarts,
        )
        out.one(
            "sidecar_tmux_heals_total",
            "counter",
            "tmux servers recreated after dying",
            v.tmux_heals,
        )
        out.family(
            "sidecar_tmux_server_deaths_total",
            "counter",
            "tmux servers that died under the sidecar, by the signal that killed them "
            "(SIGSEGV, SIGABRT: a crash; SIGKILL, SIGTERM: a kill; none: it exited)",
            [((("signal", name),), n) for name, n in tmux_deaths(v.tmux_deaths)],
        )
        out.summary(
            "sidecar_resleeve_duration_seconds",
            "Finished resleeves: from the request to the new CLI running",
            v.resleeves,
            v.resleeve_seconds,
        )
        out.one("sidecar_resleeving", "gauge", "1 while a resleeve runs", int(v.resleeving))
        for name, depth in depths.items():
            if depth is not None:
                out.one(
                    f"sidecar_{name}_messages", "gauge", f"Messages in .needlecast/{name}.md", depth
                )
        out.one("sidecar_events_clients", "gauge", "Open /events streams", self.sup.bus.subscribers)
        approvals(out, self.sup.awareness.approvals)
        out.family(
            "sidecar_http_requests_total",
            "counter",
            "HTTP requests answered, by route, method and status class",
            [
                ((("route", route), ("method", method), ("code", code)), n)
                for (route, method, code), n in sorted(self.requests.by_label().items())
            ],
        )
        out.family(
            "sidecar_egress_allowed_total",
            "counter",
            "Connections the egress proxy let through, by the allowlist pattern that allowed them",
            [((("pattern", pattern),), n) for pattern, n in v.egress_allowed],
        )
        out.family(
            "sidecar_egress_denied_total",
            "counter",
            "Attempts of the CLI to reach a host off the egress allowlist, by how (no host label)",
            [((("how", how),), n) for how, n in v.egress_denied] if v.egress.mode != "open" else [],
        )
        swaps = self.sup.egress.secrets
        out.family(
            "sidecar_secret_placeholder_unlisted_total",
            "counter",
            "Requests that carried a secret's placeholder to a host it is not listed for (sent "
            "unchanged), by secret",
            sorted(((("secret", name),), n) for name, n in swaps.unlisted.items()) if swaps else [],
        )
        audit = self.sup.audit
        out.one("sidecar_audit_records_total", "counter", "Audit records on disk", audit.written)
        out.one(
            "sidecar_audit_dropped_total",
            "counter",
            "Audit records lost: the disk refused them longer than memory could hold them",
            audit.dropped,
        )
        out.one(
            "sidecar_audit_failing",
            "gauge",
            "1 while the disk refuses the audit trail (records held in memory)",
            int(audit.problem is not None),
        )
        usage(out, v.usage)
        out.family(
            "sidecar_notifications_total",
            "counter",
            "Notifications by channel and outcome: sent (delivered), failed (after its retries), "
            "suppressed (held back: cooldown, a person typing)",
            [
                ((("channel", c.name), ("outcome", outcome)), getattr(c, outcome))
                for c in v.notify.channels
                for outcome in ("sent", "failed", "suppressed")
            ],
        )
        process_metrics(out, self.started)
        return out

    async def handle(self, request: web.Request) -> web.Response:
        depths = await self.depths()
        body = self.exposition(view.of(self.sup), depths).render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
