"""The process state machine (`sidecar.core.states`): every legal move is made and announced once,
every other move is refused and changes nothing, a taken-over state can be restored only
before the first move, and the backoff is counted by one rule in the move into BACKOFF."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import pytest

from sidecar.core.states import (
    BACKOFF_RESET_AFTER,
    MOVES,
    RETRY_SOON,
    IllegalMove,
    ProcessState,
    ProcState,
    ProcStatus,
    next_backoff,
)

ALL_MOVES = list(itertools.product(ProcState, ProcState))
LEGAL = [(a, b) for a, b in ALL_MOVES if b in MOVES[a]]
ILLEGAL = [(a, b) for a, b in ALL_MOVES if b not in MOVES[a]]


def machine_in(state: ProcState) -> tuple[ProcessState, list[tuple[ProcState, ProcState, bool]]]:
    seen: list[tuple[ProcState, ProcState, bool]] = []
    machine = ProcessState(lambda old, new, restored: seen.append((old.state, new.state, restored)))
    machine.restore(ProcStatus(state))
    seen.clear()
    return machine, seen


@pytest.mark.parametrize(("old", "new"), LEGAL, ids=lambda s: s.value)
def test_a_legal_move_is_made_and_announced_once(old: ProcState, new: ProcState) -> None:
    machine, seen = machine_in(old)
    machine.change(ProcStatus(new, reason="why"))
    assert machine.status == ProcStatus(new, reason="why")
    assert seen == [(old, new, False)]


@pytest.mark.parametrize(("old", "new"), ILLEGAL, ids=lambda s: s.value)
def test_an_illegal_move_is_refused_and_changes_nothing(old: ProcState, new: ProcState) -> None:
    machine, seen = machine_in(old)
    with pytest.raises(IllegalMove, match=f"{old.value} -> {new.value}"):
        machine.change(ProcStatus(new))
    assert machine.state is old
    assert seen == []


def test_the_moves_a_process_lives_by() -> None:
    # The paths the supervisor takes: start, exit and restart, heal, resleeve, shutdown.
    assert ProcState.RUNNING in MOVES[ProcState.STARTING]
    assert ProcState.BACKOFF in MOVES[ProcState.EXITED]
    assert ProcState.STARTING in MOVES[ProcState.BACKOFF]
    assert ProcState.STARTING in MOVES[ProcState.RUNNING]  # the tmux server died: healed
    assert ProcState.BACKOFF in MOVES[ProcState.STARTING]  # tmux could not start the pane
    assert ProcState.STARTING in MOVES[ProcState.STOPPING]  # a resleeve's second half
    assert all(ProcState.STOPPING in MOVES[s] for s in ProcState if s is not ProcState.STOPPING)
    # Nothing runs without starting first, and a stopped process stays stopped until started.
    assert not any(ProcState.RUNNING in MOVES[s] for s in ProcState if s is not ProcState.STARTING)
    assert MOVES[ProcState.STOPPED] == {ProcState.STARTING, ProcState.STOPPING}


def test_restore_is_announced_as_such_and_only_before_any_move() -> None:
    seen: list[bool] = []
    machine = ProcessState(lambda old, new, restored: seen.append(restored))
    machine.restore(ProcStatus(ProcState.BACKOFF, reason="restarting in 2s"))
    assert machine.status.reason == "restarting in 2s"
    assert seen == [True]
    machine.change(ProcStatus(ProcState.STARTING))
    with pytest.raises(IllegalMove, match="restore"):
        machine.restore(ProcStatus(ProcState.RUNNING))
    assert machine.state is ProcState.STARTING


def test_the_backoff_rule_doubles_to_its_cap_and_starts_anew_after_a_healthy_run() -> None:
    delays = []
    failures = 0
    for _ in range(7):
        failures, delay = next_backoff(failures, ran=0.5)
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert failures == 7
    # A process that stayed up BACKOFF_RESET_AFTER was healthy: soon, and counted anew.
    assert next_backoff(failures, ran=BACKOFF_RESET_AFTER) == (0, RETRY_SOON)
    assert next_backoff(0, ran=0.5) == (1, 1.0)


def test_the_move_into_backoff_keeps_the_count_and_when_the_next_start_is_due() -> None:
    saved: list[ProcStatus] = []
    machine = ProcessState(lambda old, new, restored: saved.append(new))
    machine.change(ProcStatus(ProcState.STARTING, failures=2))
    before = time.monotonic()
    delay = machine.back_off(replace(machine.status, exit_code=3), "exited with 3")
    after = time.monotonic()
    status = machine.status
    assert (status.state, status.exit_code, status.failures, delay) == (
        ProcState.BACKOFF,
        3,
        3,
        4.0,
    )
    assert status.reason == "exited with 3; restarting in 4s"
    assert status.restart_due is not None and before + delay <= status.restart_due <= after + delay
    assert saved[-1] == status  # what the move saved is the record with its bookkeeping
    # Ran long enough since `started_at`: healthy, so soon and counted anew; no `why`.
    machine.change(ProcStatus(ProcState.STARTING, failures=3, started_at=time.monotonic() - 60))
    assert machine.back_off(machine.status) == RETRY_SOON
    assert (machine.status.failures, machine.status.reason) == (0, "restarting in 0.1s")


def test_amend_changes_the_record_not_the_state() -> None:
    saved: list[tuple[ProcState, ProcState, int | None]] = []
    machine = ProcessState(lambda old, new, restored: saved.append((old.state, new.state, new.pid)))
    machine.change(ProcStatus(ProcState.STARTING))
    machine.amend(replace(machine.status, pid=42))
    assert saved[-1] == (ProcState.STARTING, ProcState.STARTING, 42)
    with pytest.raises(IllegalMove, match="amend"):
        machine.amend(ProcStatus(ProcState.RUNNING))
    assert machine.status == ProcStatus(ProcState.STARTING, pid=42)
