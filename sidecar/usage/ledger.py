"""The agent's usage totals and its budget's state, in one small file of the state dir
(`usage.json`, 0600), rewritten whenever a report is counted or the budget changes, never on a
timer: a supervisor started again after a crash, or a resleeve, goes on counting from it. The file
names the init process it belongs to; one of another run of the sidecar is no state (counting
starts again, from the environment's budget).

A rewrite is one `pwrite` of the whole record at the file's start, padded with spaces to the
file's length (JSON allows them after the value): a process that dies at any moment leaves the
old record or the new one, and a report costs two system calls where a new file and a rename cost
a millisecond (measured here: the OTLP receiver answers within one).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

import msgspec

from sidecar.core.contract import rfc3339
from sidecar.core.files import read_regular, write_new
from sidecar.usage import prices
from sidecar.usage.reports import UsageReport

log = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 1024 * 1024
MAX_MODELS = 64  # models counted apart; the rest together as "other" (a forged report's names)
CostFrom = Literal["cli", "prices", "unknown"]


class Counts(msgspec.Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_creation_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_creation_tokens
        )

    def add(self, report: UsageReport, cost: float) -> None:
        self.input_tokens += report.input
        self.output_tokens += report.output
        self.cache_read_tokens += report.cache_read
        self.cache_creation_tokens += report.cache_creation
        self.cost_usd += cost
        self.requests += 1


class Run(Counts, kw_only=True):
    """One CLI run's share."""

    cli: str
    started: str


class BudgetState(msgspec.Struct):
    usd: float | None = None
    tokens: int | None = None
    changed: bool = False  # set through PATCH /budget: wins over the environment after a crash
    warned: bool = False  # the 80 % event went out for these limits
    exceeded: bool = False
    interrupted: bool = False  # the turn was interrupted for this exceeding (once)


class Record(msgspec.Struct, kw_only=True):
    version: int = VERSION
    init: tuple[int, float] | None = None  # the init process (pid, start) this count is of
    since: str = msgspec.field(default_factory=rfc3339)
    totals: Counts = msgspec.field(default_factory=Counts)
    by_model: dict[str, Counts] = msgspec.field(default_factory=dict)
    run: Run | None = None
    budget: BudgetState = msgspec.field(default_factory=BudgetState)


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(Record).decode


class Ledger:
    """`init`: the init process this sidecar runs under; `usd`, `tokens`: the environment's
    budget (used unless the file holds one changed through the API)."""

    def __init__(
        self, path: Path, init: tuple[int, float] | None, usd: float | None, tokens: int | None
    ) -> None:
        self.path = path
        self._fd: int | None = None
        self._size = 0  # the file's length: a shorter record is padded to it
        self.record = self._load(init)
        budget = self.record.budget
        if not budget.changed and (budget.usd, budget.tokens) != (usd, tokens):
            self.record.budget = BudgetState(usd, tokens)

    def _load(self, init: tuple[int, float] | None) -> Record:
        raw = read_regular(self.path, MAX_BYTES)
        if raw is not None:
            try:
                record = _decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("%s is unusable (%s); counting starts again", self.path, exc)
            else:
                if record.version == VERSION and record.init == init and init is not None:
                    return record
        return Record(init=init)

    def save(self) -> None:
        """Write the file (a failure is logged: the counts live in memory)."""
        data = _encode(self.record)
        try:
            if self._fd is None:
                # A new file each start (rename: a symlink planted there is replaced, never
                # followed), kept open for the rewrites.
                write_new(self.path, data, 0o600)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            else:
                os.pwrite(self._fd, data.ljust(self._size), 0)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)
            return
        self._size = max(self._size, len(data))

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def new_run(self, cli: str) -> None:
        self.record.run = Run(cli=cli, started=rfc3339())
        self.save()

    def add(self, report: UsageReport) -> tuple[float, CostFrom]:
        """Count one model request; its cost and where the cost came from. Saved."""
        source: CostFrom = "cli"
        cost = report.cost_usd
        if cost is None:
            cost = prices.cost(report)
            source = "prices" if cost is not None else "unknown"
        cost = cost or 0.0
        record = self.record
        model = report.model
        if model not in record.by_model and len(record.by_model) >= MAX_MODELS:
            model = "other"
        for counts in (record.totals, record.by_model.setdefault(model, Counts()), record.run):
            if counts is not None:
                counts.add(report, cost)
        self.save()
        return cost, source
