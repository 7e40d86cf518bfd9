"""Taking over after a crash, the deciding half: what a supervisor started again does with what
it finds. `decide` is pure: it weighs the state file a dead supervisor left
(`sidecar.process.persist`) against a snapshot of what runs on the state dir's tmux socket
(`Observed`, which `sidecar.process.takeover` reads from tmux and /proc and then carries the
plan out through the runner's own methods).

The rule: adopt only what the record names exactly (tmux server and pane process by pid and
start time, the pane's argv by digest, the CLI's argv as the registry has it for the recorded
CLI); a record that does not match is no record (fresh start), never a wrong adoption.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from sidecar.agent.registry import CLIDef
from sidecar.core.states import ProcState
from sidecar.pane.tmux import PaneInfo, fatal_pane_argv
from sidecar.process.persist import ProcRef, SupervisorState


class Plan(Enum):
    FRESH = "fresh start"  # as at a first start; whatever runs on the socket is stopped first
    ADOPT = "adopt"  # take over the pane and the CLI in it as they are
    RELAUNCH = "relaunch"  # same tmux server; start the recorded CLI in the pane (resume argv)
    HEAL = "heal"  # the tmux server is gone: a new session with the recorded CLI (resume argv)


@dataclass(frozen=True)
class Decision:
    plan: Plan
    why: str  # for the one log line per adoption


@dataclass(frozen=True)
class Observed:
    """What runs now, looked at once before deciding: the pane tmux reports on our socket (None:
    no server or session), and what /proc says of its processes and of the recorded CLI."""

    live: PaneInfo | None = None
    server: ProcRef | None = None  # the live pane's tmux server, by pid and start time
    pane: ProcRef | None = None  # the live pane's process
    pane_command: str | None = None  # `persist.digest` of the argv the pane's process runs
    cli_parent: int | None = None  # the recorded CLI's parent, while it is that very process


def _server_is(record: SupervisorState, seen: Observed) -> bool:
    return record.tmux is not None and record.tmux == seen.server


def _launched(record: SupervisorState, live: PaneInfo, seen: Observed) -> bool:
    """The pane runs exactly the command the record was about to start."""
    return not live.dead and seen.pane_command == record.pane_command


def decide(
    record: SupervisorState | None,
    found: str,
    init: ProcRef | None,
    seen: Observed,
    argvs: Collection[tuple[str, ...]],
) -> Decision:
    """`record` as loaded (None: `found` says why), this sidecar's init, what runs now, and the
    argvs the recorded CLI may have run with."""
    if record is None:
        return Decision(Plan.FRESH, found)
    if init is None or record.init != init:
        return Decision(Plan.FRESH, "state file from another sidecar run")
    if record.argv not in argvs:
        return Decision(Plan.FRESH, f"state file from another CLI than {record.cli!r}")
    live = seen.live
    if record.cli_state == ProcState.STARTING.value:
        return _decide_starting(record, live, seen)
    if live is None:
        return Decision(Plan.HEAL, "tmux server gone")
    if not _server_is(record, seen):
        return Decision(Plan.FRESH, "another tmux server than the one recorded")
    if record.pane is None or live.pane_pid != record.pane.pid:
        return Decision(Plan.FRESH, "another pane process than the one recorded")
    if not live.dead:
        if seen.pane != record.pane or seen.pane_command != record.pane_command:
            return Decision(Plan.FRESH, "the pane runs another command than the one recorded")
        if seen.cli_parent is not None and seen.cli_parent != live.pane_pid:
            return Decision(Plan.FRESH, "the recorded CLI pid is not the pane's CLI")
    return Decision(Plan.ADOPT, "state file matches the running tmux server and pane")


def _decide_starting(record: SupervisorState, live: PaneInfo | None, seen: Observed) -> Decision:
    """The crash came between saving a launch and saving its result: the launch went into a
    new server (recorded without one) or into the recorded server."""
    if live is None:
        return Decision(Plan.HEAL, "tmux server gone; the CLI was being started")
    server_ok = record.tmux is None or _server_is(record, seen)
    if server_ok and _launched(record, live, seen):
        return Decision(Plan.ADOPT, "the CLI being started when it crashed runs")
    if _server_is(record, seen):
        return Decision(Plan.RELAUNCH, "the CLI was being started and is not running yet")
    return Decision(Plan.FRESH, "another tmux server than the one recorded")


def argvs_of(record: SupervisorState, registry: Mapping[str, CLIDef]) -> set[tuple[str, ...]]:
    """The argvs the recorded CLI may have been started with: the recorded one when it was made
    from the registry's command or resume argv for that CLI, and the placeholder of a CLI that
    could not start."""
    cli = registry.get(record.cli)
    argvs = set()
    if cli is not None and record.command in (cli.command, cli.resume):
        argvs.add(record.argv)
    if record.cli_state == ProcState.FATAL.value and record.reason is not None:
        argvs.add(fatal_pane_argv(record.reason))
    return argvs


def found_text(live: PaneInfo | None) -> str:
    return "no tmux session" if live is None else f"tmux {live.server_pid} pane {live.pane_pid}"
