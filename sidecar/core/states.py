"""Named process states (supervisord's model), shared by the CLI, the tmux server and ttyd.

A process moves STOPPED -> STARTING -> RUNNING -> (EXITED -> BACKOFF -> STARTING ...) and ends
in STOPPING -> STOPPED at shutdown; FATAL means it cannot start and nothing retries by itself.
`MOVES` lists every legal transition; `ProcessState.change` refuses the others. Each
transition is commented where it is made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum


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


class IllegalMove(RuntimeError):
    """A state change `MOVES` does not allow: a bug in the caller, never a user's input."""


class ProcessState:
    """One process's status, changed only through `change` (supervisord's `change_state`):
    the move is checked, made, and `on_change(old, new, restored)` runs (persist, notify,
    publish; `restored`: a state taken over from a dead supervisor, announced before)."""

    def __init__(
        self,
        on_change: Callable[[ProcStatus, ProcStatus, bool], None],
        moves: Mapping[ProcState, frozenset[ProcState]] = MOVES,
    ) -> None:
        self.status = ProcStatus()
        self._on_change = on_change
        self._moves = moves
        self._moved = False

    @property
    def state(self) -> ProcState:
        return self.status.state

    def change(self, new: ProcStatus) -> None:
        old = self.status
        if new.state not in self._moves[old.state]:
            msg = f"illegal process state change {old.state.value} -> {new.state.value}"
            raise IllegalMove(msg)
        self._set(old, new, restored=False)

    def restore(self, status: ProcStatus) -> None:
        """Take over a state a dead supervisor recorded: only before any other change."""
        if self._moved:
            msg = f"restore to {status.state.value} after the state has changed"
            raise IllegalMove(msg)
        self._set(self.status, status, restored=True)

    def _set(self, old: ProcStatus, new: ProcStatus, *, restored: bool) -> None:
        self.status, self._moved = new, True
        self._on_change(old, new, restored)


# Backoff between restarts (the CLI's and ttyd's): 1 s, doubling, capped.
BACKOFF_START, BACKOFF_CAP = 1.0, 30.0
# A process that stayed up this long is healthy again: its next failure starts the backoff anew.
BACKOFF_RESET_AFTER = 10.0


def backoff_delay(failures: int) -> float:
    """Seconds to wait before try number `failures + 1` (`failures` >= 1)."""
    return float(min(BACKOFF_START * 2 ** max(failures - 1, 0), BACKOFF_CAP))
