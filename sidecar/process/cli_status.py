"""The CLI's record: its status and everything a supervisor started again after a crash needs of
it (which CLI, how it was launched, which tmux server, pane and process it is), the value every
move of the CLI's `ProcessState` carries and saves. `persist.SupervisorState` holds it on disk:
`fields_of` and `of_record` are the two directions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.core.states import ProcState, ProcStatus
from sidecar.process.persist import ProcRef, SupervisorState


@dataclass(frozen=True)
class CliStatus(ProcStatus):
    cli: str = ""  # the registry name of the CLI (being) started
    # The registry's argv the launch started from (its command or resume argv), the argv the
    # pane runs (that one with our hook settings, session arguments and the egress guard), and
    # whether the resume argv was used.
    command: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    resume: bool = False
    pane_command: str = ""  # `persist.digest` of the pane's argv: names the launch
    tmux: ProcRef | None = None  # the tmux server (None: a launch into a new one)
    pane: ProcRef | None = None  # the pane's process (the waiter around the CLI)
    process: ProcRef | None = None  # the CLI's process, while it runs


def fields_of(status: CliStatus) -> dict[str, Any]:
    """The fields of a `SupervisorState` that record `status`."""
    return {
        "cli": status.cli,
        "cli_state": status.state.value,
        "command": status.command,
        "argv": status.argv,
        "resume": status.resume,
        "pane_command": status.pane_command,
        "tmux": status.tmux,
        "pane": status.pane,
        "cli_pid": status.process,
        "exit_code": status.exit_code,
        "reason": status.reason,
        "started_at": status.started_at,
        "backoff_n": status.failures,
        "restart_due": status.restart_due,
    }


def of_record(record: SupervisorState) -> CliStatus:
    """The CLI's record as `record` saved it."""
    return CliStatus(
        state=ProcState(record.cli_state),
        pid=record.cli_pid.pid if record.cli_pid is not None else None,
        exit_code=record.exit_code,
        reason=record.reason,
        started_at=record.started_at,
        failures=record.backoff_n,
        restart_due=record.restart_due,
        cli=record.cli,
        command=record.command,
        argv=record.argv,
        resume=record.resume,
        pane_command=record.pane_command,
        tmux=record.tmux,
        pane=record.pane,
        process=record.cli_pid,
    )
