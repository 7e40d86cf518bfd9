"""The agent's bill and its limit, wired in: each launch of a CLI that reports its usage gets a
new telemetry secret and the variables that point its reports at the sidecar; each report is
counted (`sidecar.usage.ledger`), published as a `usage` event and sent on to the user's own
destination; and the budget acts. At 80 % of a limit a `budget` event warns; at the limit the
requests waiting are denied and so is every later one (`by: "budget"`, with a message the agent
reads), the turn is interrupted once with the CLI's own keys, the agent is `waiting` with reason
`budget` and `/input` refuses text, until `PATCH /budget` raises or clears the limit.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from msgspec import UnsetType

from sidecar.agent.approvals import Answer, Approvals
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.statefile import AgentFiles
from sidecar.config import Config
from sidecar.core.contract import InputKey
from sidecar.core.event_shapes import BudgetEvent, UsageEvent
from sidecar.core.events import EventBus
from sidecar.core.loopback import loopback_url
from sidecar.core.proc import start_time
from sidecar.core.shapes import BudgetInfo, RunUsage, TokenCounts, UsageInfo
from sidecar.usage import budget, otlp
from sidecar.usage.ledger import Counts, Ledger
from sidecar.usage.relay import Relay
from sidecar.usage.reports import UsageReport
from sidecar.usage.telemetry import Destination, Telemetry, TelemetryLaunch, telemetry_url

log = logging.getLogger(__name__)

BUDGET_REASON = "budget"  # the agent's `waiting` reason while the budget is spent
Press = Callable[[tuple[InputKey, ...]], Awaitable[None]]


def _counts(c: Counts) -> TokenCounts:
    return TokenCounts(
        input_tokens=c.input_tokens,
        output_tokens=c.output_tokens,
        cache_read_tokens=c.cache_read_tokens,
        cache_creation_tokens=c.cache_creation_tokens,
        cost_usd=round(c.cost_usd, 9),
        requests=c.requests,
    )


class Spending:
    """`press` types keys into the CLI (under the lock every typing takes)."""

    def __init__(
        self,
        config: Config,
        bus: EventBus,
        machine: AgentMachine,
        approvals: Approvals,
        *,
        files: AgentFiles,
        press: Press,
    ) -> None:
        self.config = config
        self.bus = bus
        self.machine = machine
        self.approvals = approvals
        self.files = files
        self.press = press
        init = os.getppid()
        started = start_time(init)
        self.ledger = Ledger(
            config.paths.usage_state,
            (init, started) if started is not None else None,
            config.budget_usd,
            config.budget_tokens,
        )
        self.relay = Relay()
        self.cli = ""  # the running CLI's knowledge name: its reports' URL segment
        self.telemetry: Telemetry | None = None
        self.reporting = False  # the running CLI reports its usage (telemetry or its events)
        self.interrupt: tuple[InputKey, ...] = ("C-c",)
        self._destination: Destination | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        approvals.gate = self._gate
        if self.ledger.record.budget.exceeded:  # a supervisor taking over: still spent
            machine.hold(BUDGET_REASON)

    # ---- launches ----------------------------------------------------------------------------

    def use(self, cli: CLIDef, *, adopted: bool) -> None:
        """The CLI that runs now (a new run, unless `adopted` after a crash)."""
        known = cli.knowledge
        self.telemetry = known.telemetry if known is not None else None
        self.cli = known.name if known is not None and self.telemetry is not None else ""
        self.interrupt = known.interrupt if known is not None else ("C-c",)
        # Or its own event stream carries its usage (`sidecar.agent.event_source` reads it).
        stream = known.events if known is not None and cli.state == "events" else None
        self.reporting = self.telemetry is not None or (
            stream is not None and stream.bill is not None
        )
        if not adopted:
            self.ledger.new_run(cli.name)

    def launch_env(
        self, cli: CLIDef, env: Mapping[str, str]
    ) -> tuple[tuple[str, ...], Mapping[str, str]]:
        """The arguments and variables that make `cli` report its usage here (`env`: its
        environment, the user's own OTEL_* in it), with a new secret; nothing for a CLI that
        reports none."""
        self.use(cli, adopted=False)
        if self.telemetry is None:
            self.files.update(telemetry_secret=None)
            return (), {}
        secret = secrets.token_urlsafe(32)
        self.files.update(telemetry_secret=secret)
        full = {**env, **cli.env}
        self._destination = self.telemetry.destination(full)
        base = loopback_url(self.config.host, self.config.port)
        start = TelemetryLaunch(telemetry_url(base, self.cli), secret, full)
        return self.telemetry.args(start), self.telemetry.launch(start)

    # ---- reports -----------------------------------------------------------------------------

    def secret_matches(self, cli: str, given: str | None) -> bool:
        """Constant-time check of a report's secret against the running CLI's."""
        expected = self.files.record.telemetry_secret
        if given is None or expected is None or not self.cli or cli != self.cli:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())

    def report(self, raw: bytes, content_type: str) -> int:
        """An OTLP logs request of the running CLI (its secret checked): every model request in
        it counted. How many. Raises otlp.BadBody or BadReport (nothing of it is counted)."""
        assert self.telemetry is not None
        read = self.telemetry.read
        found: list[UsageReport] = []
        for record in otlp.records(raw):
            usage = read(record)
            if usage is not None:
                found.append(usage)
        self.count(found)
        if self._destination is not None:
            self.relay.send(self._destination, raw, content_type)
        return len(found)

    def count(self, found: list[UsageReport]) -> None:
        """Model requests of the running CLI: each counted and published, then the budget."""
        for usage in found:
            cost, source = self.ledger.add(usage)
            self.bus.publish(
                UsageEvent(
                    cli=self._run_cli(),
                    model=usage.model,
                    input_tokens=usage.input,
                    output_tokens=usage.output,
                    cache_read_tokens=usage.cache_read,
                    cache_creation_tokens=usage.cache_creation,
                    cost_usd=round(cost, 9),
                    cost_from=source,
                )
            )
        if found:
            self._check()

    def _run_cli(self) -> str:
        run = self.ledger.record.run
        return run.cli if run is not None else self.cli

    # ---- the budget ----------------------------------------------------------------------------

    def _spent(self) -> tuple[float, int]:
        totals = self.ledger.record.totals
        return totals.cost_usd, totals.tokens

    def _level(self) -> budget.Level:
        state = self.ledger.record.budget
        return budget.level(budget.spent_share(state.usd, state.tokens, *self._spent()))

    def _describe(self) -> str:
        state = self.ledger.record.budget
        return budget.describe(state.usd, state.tokens, *self._spent())

    def _check(self) -> None:
        """After a report: warn at 80 %, act at 100 % (each once per limit)."""
        state = self.ledger.record.budget
        level = self._level()
        if level == "exceeded" and not state.exceeded:
            state.exceeded = state.warned = True
            self.ledger.save()
            self._event("exceeded", f"the budget is spent: {self._describe()}")
            self._exceeded()
        elif level == "warning" and not state.warned:
            state.warned = True
            self.ledger.save()
            self._event("warning", f"80 % of the budget is spent: {self._describe()}")

    def _event(self, level: Any, message: str) -> None:
        state = self.ledger.record.budget
        usd, tokens = self._spent()
        log.warning("budget %s: %s", level, message)
        self.bus.publish(
            BudgetEvent(
                level=level,
                message=message,
                spent_usd=round(usd, 9),
                spent_tokens=tokens,
                usd=state.usd,
                tokens=state.tokens,
            )
        )

    def _exceeded(self) -> None:
        """Deny what waits, hold the agent, interrupt the turn (once)."""
        doing = self.machine.doing
        for waiting in self.approvals.pending():
            self.approvals.answer(waiting.id, self._refusal())
        self.machine.hold(BUDGET_REASON)
        state = self.ledger.record.budget
        if not state.interrupted and doing in ("working", "waiting"):
            state.interrupted = True
            self.ledger.save()
            task = asyncio.ensure_future(self.press(self.interrupt))
            self._tasks.add(task)
            task.add_done_callback(self._pressed)

    def _pressed(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("the budget's interrupt was not typed: %s", task.exception())

    def _refusal(self) -> Answer:
        message = (
            f"The sleeve's budget is spent ({self._describe()}), so the sidecar denied this "
            "request. Stop here: a person must raise the budget before the work goes on."
        )
        return Answer("deny", "budget", message)

    def _gate(self) -> Answer | None:
        return self._refusal() if self.ledger.record.budget.exceeded else None

    def refuse_text(self) -> str | None:
        """`/input` text while the budget is spent: why not."""
        if not self.ledger.record.budget.exceeded:
            return None
        return (
            f"the budget is spent ({self._describe()}): no text is typed into the CLI until "
            "PATCH /budget raises or clears the limit"
        )

    def change(self, usd: float | UnsetType | None, tokens: int | UnsetType | None) -> BudgetInfo:
        """PATCH /budget: a number sets a limit, None clears it, UNSET keeps it."""
        state = self.ledger.record.budget
        if not isinstance(usd, UnsetType):
            state.usd = None if usd is None else float(usd)
        if not isinstance(tokens, UnsetType):
            state.tokens = tokens
        state.changed = True
        level = self._level()
        state.warned = level in ("warning", "exceeded")
        if level != "exceeded" and state.exceeded:
            state.exceeded = state.interrupted = False
            self.machine.hold(None)
            log.info("budget raised: %s; the agent may go on", self._describe())
        self.ledger.save()
        if level == "exceeded" and not state.exceeded:
            self._check()
        return self.budget_info()

    # ---- what /status shows ------------------------------------------------------------------

    def budget_info(self) -> BudgetInfo:
        state = self.ledger.record.budget
        usd, tokens = self._spent()
        return BudgetInfo(
            usd=state.usd,
            tokens=state.tokens,
            spent_usd=round(usd, 9),
            spent_tokens=tokens,
            state=self._level(),
        )

    def info(self) -> UsageInfo:
        record = self.ledger.record
        totals = _counts(record.totals)
        run = record.run
        return UsageInfo(
            **{f: getattr(totals, f) for f in totals.__struct_fields__},
            by_model={model: _counts(c) for model, c in sorted(record.by_model.items())},
            since=record.since,
            reporting=self.reporting,
            run=None
            if run is None
            else RunUsage(
                **{f: getattr(_counts(run), f) for f in TokenCounts.__struct_fields__},
                cli=run.cli,
                started=run.started,
            ),
            budget=self.budget_info(),
        )

    @property
    def warnings(self) -> list[str]:
        """A limit is set and the running CLI reports nothing to count against it."""
        state = self.ledger.record.budget
        limited = state.usd is not None or state.tokens is not None
        run = self.ledger.record.run
        if not limited or self.reporting or run is None:
            return []
        return [f"a budget is set, but {run.cli} reports no usage: nothing it spends is counted"]

    async def close(self) -> None:
        await self.relay.close()
        self.ledger.close()
