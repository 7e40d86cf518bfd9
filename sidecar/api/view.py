"""What the HTTP layer sees of the supervisor: one immutable snapshot, taken once per request
by `of` (or `health_of`, its three fields for /health), the only functions that read the
supervisor's attributes for it. Handlers answer from the snapshot, so every field of one answer
comes from the same instant.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from sidecar.agent.machine import AgentStatus, seconds_in_states
from sidecar.core.contract import AgentStateName
from sidecar.core.shapes import EgressInfo, NotifyInfo, UsageInfo
from sidecar.core.states import ProcState, ProcStatus

if TYPE_CHECKING:  # typing only: the snapshot sits below the supervisor, which may take it
    from sidecar.process.supervisor import Supervisor


# A NamedTuple, not a frozen dataclass: one is taken on every /health, and a frozen dataclass
# sets each field through object.__setattr__, several times /health's own work (measured:
# docs/benchmarks.md).
class SupervisorView(NamedTuple):
    taken: float  # time.monotonic() when the snapshot was taken
    uptime: float  # seconds since the sidecar (init, not this supervisor) started
    healthy: bool  # the CLI runs
    cli_name: str
    cli: ProcStatus
    ttyd: ProcStatus
    resleeving: bool
    warnings: tuple[str, ...]  # the supervisor's own (CURRENT.md's come with its parse)
    restarts: int  # supervisors that ran before this one (crashed)
    restarted_at: str | None  # when this supervisor started, if it is such a restart
    pane_tty: str | None  # the tty of the CLI's pane, while there is one
    current_mtime: float | None  # CURRENT.md's mtime when it was last parsed
    agent: AgentStatus
    agent_totals: Mapping[str, float]  # seconds in each state before the current
    agent_since: float  # time.monotonic() the current state began
    cli_exits: tuple[tuple[str, int], ...]  # CLI exits the sidecar did not cause, by code
    cli_restarts: int  # CLI starts by the restart policy
    tmux_heals: int  # tmux servers recreated after dying
    tmux_deaths: tuple[tuple[str, int], ...]  # tmux server deaths, by signal
    resleeves: int  # finished resleeves
    resleeve_seconds: float  # their summed duration
    egress: EgressInfo
    egress_allowed: tuple[tuple[str, int], ...]  # connections allowed, by listed pattern
    egress_denied: tuple[tuple[str, int], ...]  # attempts refused, by how (never by host)
    screen: tuple[int, int]  # the CLI's screen: columns, rows
    usage: UsageInfo  # what the agent spent, and the budget
    notify: NotifyInfo  # the notification channels and their counts

    def agent_seconds(self) -> dict[str, float]:
        """Seconds the agent spent in each state, up to the snapshot."""
        return seconds_in_states(self.agent_totals, self.agent.state, self.agent_since, self.taken)


class HealthView(NamedTuple):
    """What /health needs: liveness probes call it every few seconds, so it reads three
    things, not the whole snapshot."""

    healthy: bool
    uptime: float
    agent: AgentStateName


def health_of(sup: Supervisor) -> HealthView:
    return HealthView(
        sup.runner.process.status.state is ProcState.RUNNING,
        time.monotonic() - sup.started,
        sup.awareness.machine.state,
    )


def of(sup: Supervisor) -> SupervisorView:
    """The supervisor as it is now."""
    now = time.monotonic()
    machine = sup.awareness.machine
    stats = sup.stats
    pane = sup.pane
    return SupervisorView(
        now,
        now - sup.started,
        sup.healthy,
        sup.cli_name,
        sup.cli,
        sup.ttyd.status,
        sup.resleeving,
        (*sup.warnings, *sup.awareness.warnings, *sup.rules.warnings),
        sup.restarts,
        sup.restarted_at,
        pane.tty if pane is not None else None,
        sup.current.mtime,
        machine.status(),
        machine.totals,
        machine.since_monotonic,
        tuple(stats.cli_exits.items()),
        stats.cli_restarts,
        stats.tmux_heals,
        tuple(stats.tmux_deaths.items()),
        stats.resleeves,
        stats.resleeve_seconds,
        sup.egress.info(),
        tuple(sup.egress.allowed_by.items()),
        tuple(sup.egress.denied_by_how.items()),
        sup.awareness.screen_size,
        sup.awareness.spending.info(),
        sup.notifier.info(),
    )
