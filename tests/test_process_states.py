"""The process state machine (`sidecar.core.states`): every legal move is made and announced once,
every other move is refused and changes nothing, and a taken-over state can be restored only
before the first move."""

from __future__ import annotations

import itertools

import pytest

from sidecar.core.states import MOVES, IllegalMove, ProcessState, ProcState, ProcStatus

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
