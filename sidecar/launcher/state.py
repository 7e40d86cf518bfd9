"""`$SLEEVE_HOME/state.json`: the record of every run (reconciled with reality by `runtimes`).

Every write is a read-modify-write under an flock on `state.lock`, written atomically. A
corrupt file is set aside (`state.json.corrupt-<time>[.N]`, never over an older one) and
rebuilt from what is running.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from sidecar.core.proc import start_time
from sidecar.launcher.fsutil import FILE_MODE, atomic_write, locked, private_home

logger = logging.getLogger(__name__)

# Run statuses. Active ones may change on reconciliation; the rest are final.
STARTING = "starting"
RUNNING = "running"
COMPLETED = "completed"
STOPPED = "stopped"
VANISHED = "failed (vanished)"
ACTIVE = frozenset({STARTING, RUNNING})


def failed(code: int) -> str:
    return f"failed (code {code})"


def final_status(code: int, *, stop_requested: bool) -> str:
    """What an exit code means for a run: a stop we asked for is `stopped`, not a failure."""
    if stop_requested:
        return STOPPED
    return COMPLETED if code == 0 else failed(code)


@dataclass
class Run:
    id: str
    project: str  # `<slug>_<crc0>`
    slot: int
    slot_id: str
    runtime: str  # a `Runtime.name`: "docker" or "bwrap"
    cli: str
    port: int | None = None
    container: str | None = None  # docker
    pid: int | None = None  # bwrap: the waiter that owns the bwrap process
    pid_start: float | None = None  # `start_time(pid)`, to detect pid reuse
    started_at: float = field(default_factory=time.time)
    status: str = STARTING
    exit_code: int | None = None
    stop_requested: bool = False
    adopted: bool = False
    log: str | None = None
    # The sleeve's API token (state.json is 0600): `sleeve ps --json` shows it to its owner.
    token: str | None = None
    # Seconds a stop gives it before SIGKILL (`RunPlan.stop_timeout`); None: not recorded.
    stop_timeout: int | None = None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Run:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class _Malformed(ValueError):
    pass


class StateStore:
    """`read_only` (--dry-run): no lock, no writes; a corrupt file is left where it is."""

    def __init__(self, home: Path, *, read_only: bool = False) -> None:
        self.home = home
        self.path = home / "state.json"
        self.lock_path = home / "state.lock"
        self.read_only = read_only

    @contextmanager
    def transaction(self) -> Iterator[list[Run]]:
        """Yield the runs under the lock; whatever the block leaves in the list is written."""
        if self.read_only:  # atomic writes: an unlocked read still sees one whole file
            yield self._load()
            return
        private_home(self.home)
        with locked(self.lock_path):
            runs = self._load()
            before = [dataclasses.asdict(r) for r in runs]
            yield runs
            after = [dataclasses.asdict(r) for r in runs]
            if after != before or not self.path.exists():
                atomic_write(self.path, json.dumps({"version": 1, "runs": after}, indent=1) + "\n")

    def read(self) -> list[Run]:
        """The recorded runs, without reconciling (under the lock: a corrupt file is set aside
        by one reader only)."""
        if not self.path.exists():
            return []
        with self.transaction() as runs:
            return list(runs)

    def peek(self) -> list[Run]:
        """The runs as recorded, without lock, writes or warnings (a malformed file: none)."""
        try:
            return self._parse()
        except _Malformed:
            return []

    def _parse(self) -> list[Run]:
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            data = json.loads(text)
            return [Run.from_dict(item) for item in data["runs"]]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # any malformed shape
            raise _Malformed(exc) from exc

    def _load(self) -> list[Run]:
        try:
            return self._parse()
        except _Malformed as exc:
            if self.read_only:
                logger.warning("%s is unreadable (%s); left as it is", self.path, exc)
                return []
            aside = self._set_aside()
            logger.warning(
                "%s was unreadable (%s); kept it as %s and rebuilt it from what runs",
                self.path,
                exc,
                aside.name,
            )
            return []

    def _set_aside(self) -> Path:
        """Move the file to a `state.json.corrupt-<time>` name no earlier one has (O_EXCL)."""
        stamp, n = int(time.time()), 0
        while True:
            aside = self.path.with_name(f"state.json.corrupt-{stamp}" + (f".{n}" if n else ""))
            try:
                os.close(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
            except FileExistsError:
                n += 1
                continue
            os.replace(self.path, aside)  # over the placeholder we just made, nothing else
            return aside

    def upsert(self, run: Run) -> None:
        """Record `run`, merging with a record of the same id (a fast waiter may be first)."""
        with self.transaction() as runs:
            for i, old in enumerate(runs):
                if old.id == run.id:
                    if not old.active:  # the waiter already wrote the outcome: keep it
                        run.status, run.exit_code = old.status, old.exit_code
                    runs[i] = run
                    return
            runs.append(run)

    def finish(self, run_id: str, code: int, template: Run, *, stop_requested: bool) -> None:
        """Record the exit `code` of run `run_id` (the bwrap waiter calls this)."""
        with self.transaction() as runs:
            run = next((r for r in runs if r.id == run_id), None)
            if run is None:
                run = template
                runs.append(run)
            run.exit_code = code
            run.stop_requested = run.stop_requested or stop_requested
            run.status = final_status(code, stop_requested=run.stop_requested)

    def advance(self, run_id: str, status: str, *, only_from: frozenset[str] = ACTIVE) -> None:
        """Set run `run_id`'s `status` if it is still in one of `only_from` (never undo an end)."""
        with self.transaction() as runs:
            for run in runs:
                if run.id == run_id and run.status in only_from:
                    run.status = status

    def mark(self, run_id: str, **changes: Any) -> None:
        with self.transaction() as runs:
            for run in runs:
                if run.id == run_id:
                    for key, value in changes.items():
                        setattr(run, key, value)


def process_alive(pid: int, start: float | None) -> bool:
    """True if `pid` runs and is the same process (start time) we recorded."""
    try:
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return False
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    now = start_time(pid)
    return now is not None and (start is None or now == start)


def running_slots(runs: Sequence[Run], project: str) -> dict[int, Run]:
    """Slot index -> its active run, for one project."""
    return {r.slot: r for r in runs if r.project == project and r.active}
