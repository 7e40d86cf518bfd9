"""Named process states (supervisord's model), shared by the supervisor and the ttyd runner.

A process moves STOPPED -> STARTING -> RUNNING -> (EXITED -> BACKOFF -> STARTING ...) and ends
in STOPPING -> STOPPED at shutdown; FATAL means it cannot start and nothing retries by itself.
Each transition is commented where it is made.
"""

from __future__ import annotations

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


# Backoff between restarts (the CLI's and ttyd's): 1 s, doubling, capped.
BACKOFF_START, BACKOFF_CAP = 1.0, 30.0
# A process that stayed up this long is healthy again: its next failure starts the backoff anew.
BACKOFF_RESET_AFTER = 10.0


def backoff_delay(failures: int) -> float:
    """Seconds to wait before try number `failures + 1` (`failures` >= 1)."""
    return float(min(BACKOFF_START * 2 ** max(failures - 1, 0), BACKOFF_CAP))
