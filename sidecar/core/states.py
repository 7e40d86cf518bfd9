"""Named process states (supervisord's model), shared by the CLI and ttyd.

A process moves STOPPED -> STARTING -> RUNNING -> (EXITED -> BACKOFF -> STARTING ...) and ends
in STOPPING -> STOPPED at shutdown; FATAL means it cannot start and nothing retries by itself.
`MOVES` lists every legal transition; `ProcessState.change` refuses the others. Each
transition is commented where it is made. The record a move carries (a `ProcStatus`, which a
process may extend) is all a supervisor started again after a crash needs of that process, and
the move that makes it is what saves it; the backoff's bookkeeping is kept in the move into
BACKOFF (`ProcessState.back_off`), as supervisord's `change_state` keeps it, by one rule for
every process (`next_backoff`).

The tmux server has no state of its own: it is the CLI's host, and what happens to it shows in
the CLI's moves (its death: RUNNING -> STARTING, healed in a new server; a launch it could not
carry out: STARTING -> BACKOFF). Nothing reads a server's state, and a machine of its own would
only mirror the CLI's; `sidecar.process.tmux_server` keeps which server is ours.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Generic, TypeVar, cast


class ProcState(Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    EXITED = "exited"
    FATAL = "fatal"


@dataclass(frozen=True)
class ProcStatus:
    state: ProcState = ProcState.STOPPED
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None  # time.monotonic()
    # The backoff's bookkeeping, kept by `ProcessState.back_off`: failures in a row (ends and
    # failed starts, see `next_backoff`), and time.monotonic() when the next start is due.
    failures: int = 0
    restart_due: float | None = None

    @property
    def why_not_running(self) -> str | None:
        """Why the process does not run, in words (None: it runs, or nothing says)."""
        if self.state is ProcState.EXITED:
            return "exited" + ("" if self.exit_code is None else f" with code {self.exit_code}")
        if self.state in (ProcState.FATAL, ProcState.BACKOFF):
            return self.reason
        return None


_S = ProcState
#: Every legal move, from -> the states it may go to. A resleeve starts from any state the CLI
#: can be in; a tmux server that dies takes a running CLI with it (RUNNING -> STARTING: healed in
#: a new server); STARTING -> BACKOFF is a start that failed before the process ran (tmux could
#: not make the session). STOPPED is both the initial and the final state.
MOVES: dict[ProcState, frozenset[ProcState]] = {
    _S.STOPPED: frozenset({_S.STARTING, _S.STOPPING}),
    _S.STARTING: frozenset({_S.RUNNING, _S.BACKOFF, _S.FATAL, _S.STOPPING}),
    _S.RUNNING: frozenset({_S.EXITED, _S.STOPPING, _S.STARTING}),
    _S.EXITED: frozenset({_S.BACKOFF, _S.STARTING, _S.STOPPING}),
    _S.BACKOFF: frozenset({_S.STARTING, _S.STOPPING}),
    _S.STOPPING: frozenset({_S.STARTING, _S.STOPPED}),
    _S.FATAL: frozenset({_S.STARTING, _S.STOPPING}),
}

# The backoff between starts, for every supervised process (the CLI's restarts and the launches
# tmux could not carry out, ttyd's): 1 s, doubling, capped.
BACKOFF_START, BACKOFF_CAP = 1.0, 30.0
# A process that stayed up this long was healthy: it starts again soon, and its count anew.
BACKOFF_RESET_AFTER = 10.0
RETRY_SOON = 0.1  # seconds before the start that follows a healthy run


def next_backoff(failures: int, ran: float) -> tuple[int, float]:
    """The backoff rule: after a process that had failed `failures` times in a row ended, or
    failed to start, having run `ran` seconds, its failures in a row now and the seconds to wait
    before it starts again."""
    if ran >= BACKOFF_RESET_AFTER:
        return 0, RETRY_SOON
    failures += 1
    return failures, min(BACKOFF_START * 2 ** (failures - 1), BACKOFF_CAP)


class IllegalMove(RuntimeError):
    """A state change `MOVES` does not allow: a bug in the caller, never a user's input."""


S = TypeVar("S", bound=ProcStatus)


class ProcessState(Generic[S]):
    """One process's record, changed only through `change` (supervisord's `change_state`):
    the move is checked, made, and `on_change(old, new, restored)` runs (persist, notify,
    publish; `restored`: a state taken over from a dead supervisor, announced before).
    `initial`: the record before any move (a bare ProcStatus when not given)."""

    def __init__(
        self,
        on_change: Callable[[S, S, bool], None],
        moves: Mapping[ProcState, frozenset[ProcState]] = MOVES,
        initial: S | None = None,
    ) -> None:
        # Without `initial` this is a ProcessState[ProcStatus]: its callers give no other type.
        self.status: S = initial if initial is not None else cast("S", ProcStatus())
        self._on_change = on_change
        self._moves = moves
        self._moved = False

    @property
    def state(self) -> ProcState:
        return self.status.state

    def change(self, new: S) -> None:
        old = self.status
        if new.state not in self._moves[old.state]:
            msg = f"illegal process state change {old.state.value} -> {new.state.value}"
            raise IllegalMove(msg)
        self._set(old, new, restored=False)

    def back_off(self, failed: S, why: str | None = None) -> float:
        """-> BACKOFF after a failure (an end, or a start that failed): `failed` is the record as
        the failure left it, and this move adds the backoff's bookkeeping (`next_backoff`, from
        how long the process ran since `started_at`) and the reason: `why`, and when it starts
        again. Returns the delay in seconds."""
        now = time.monotonic()
        started = self.status.started_at
        ran = 0.0 if started is None else now - started
        failures, delay = next_backoff(self.status.failures, ran)
        again = f"restarting in {delay:g}s"
        backoff = replace(
            failed,
            state=ProcState.BACKOFF,
            reason=f"{why}; {again}" if why else again,
            failures=failures,
            restart_due=now + delay,
        )
        self.change(backoff)
        return delay

    def amend(self, new: S) -> None:
        """A change of the record that is no move (the same state, a new fact: the pid of a
        process being started), saved as a move is."""
        old = self.status
        if new.state is not old.state:
            msg = f"amend cannot change the state ({old.state.value} -> {new.state.value})"
            raise IllegalMove(msg)
        self._set(old, new, restored=False)

    def restore(self, status: S) -> None:
        """Take over a state a dead supervisor recorded: only before any other change."""
        if self._moved:
            msg = f"restore to {status.state.value} after the state has changed"
            raise IllegalMove(msg)
        self._set(self.status, status, restored=True)

    def _set(self, old: S, new: S, *, restored: bool) -> None:
        self.status, self._moved = new, True
        self._on_change(old, new, restored)
