"""Taking over after a crash: what a supervisor started again does with what it finds — the
state file a dead one left (`sidecar.process.persist`), checked against what really runs on the
state dir's tmux socket. `decide` is pure; the supervisor applies its plan through the same methods
it uses for every launch.

The rule: adopt only what the record names exactly (tmux server and pane process by pid and
start time, the pane's argv by digest, the CLI's argv as the registry has it for the recorded
CLI); a record that does not match is no record (fresh start), never a wrong adoption.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import Enum

from sidecar.agent.registry import CLIDef
from sidecar.core.proc import ppid, send_signal
from sidecar.core.states import ProcState
from sidecar.pane.tmux import PaneInfo, Tmux, fatal_pane_argv
from sidecar.process.persist import ProcRef, SupervisorState, cmdline_digest


class Plan(Enum):
    FRESH = "fresh start"  # as at a first start; whatever runs on the socket is stopped first
    ADOPT = "adopt"  # take over the pane and the CLI in it as they are
    RELAUNCH = "relaunch"  # same tmux server; start the recorded CLI in the pane (resume argv)
    HEAL = "heal"  # the tmux server is gone: a new session with the recorded CLI (resume argv)


@dataclass(frozen=True)
class Decision:
    plan: Plan
    why: str  # for the one log line per adoption


def _server_is(record: SupervisorState, live: PaneInfo) -> bool:
    return record.tmux is not None and record.tmux == ProcRef.of(live.server_pid)


def _launched(record: SupervisorState, live: PaneInfo) -> bool:
    """The pane runs exactly the command the record was about to start."""
    return not live.dead and cmdline_digest(live.pane_pid) == record.pane_command


def decide(
    record: SupervisorState | None,
    found: str,
    init: ProcRef | None,
    live: PaneInfo | None,
    argvs: Collection[tuple[str, ...]],
) -> Decision:
    """`record` as loaded (None: `found` says why), this sidecar's init, the pane tmux reports on
    our socket (None: no server or session), and the argvs the recorded CLI may have run with."""
    if record is None:
        return Decision(Plan.FRESH, found)
    if init is None or record.init != init:
        return Decision(Plan.FRESH, "state file from another sidecar run")
    if record.argv not in argvs:
        return Decision(Plan.FRESH, f"state file from another CLI than {record.cli!r}")
    if record.cli_state == ProcState.STARTING.value:
        return _decide_starting(record, live)
    if live is None:
        return Decision(Plan.HEAL, "tmux server gone")
    if not _server_is(record, live):
        return Decision(Plan.FRESH, "another tmux server than the one recorded")
    if record.pane is None or live.pane_pid != record.pane.pid:
        return Decision(Plan.FRESH, "another pane process than the one recorded")
    if not live.dead:
        if not record.pane.alive() or cmdline_digest(live.pane_pid) != record.pane_command:
            return Decision(Plan.FRESH, "the pane runs another command than the one recorded")
        cli = record.cli_pid
        if cli is not None and cli.alive() and ppid(cli.pid) != live.pane_pid:
            return Decision(Plan.FRESH, "the recorded CLI pid is not the pane's CLI")
    return Decision(Plan.ADOPT, "state file matches the running tmux server and pane")


def _decide_starting(record: SupervisorState, live: PaneInfo | None) -> Decision:
    """The crash came between saving a launch and saving its result: the launch went into a
    new server (recorded without one) or into the recorded server."""
    if live is None:
        return Decision(Plan.HEAL, "tmux server gone; the CLI was being started")
    server_ok = record.tmux is None or _server_is(record, live)
    if server_ok and _launched(record, live):
        return Decision(Plan.ADOPT, "the CLI being started when it crashed runs")
    if _server_is(record, live):
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


SOCKET_BACK_WITHIN = 1.0  # seconds tmux gets to recreate a deleted socket on SIGUSR1


async def find_pane(tmux: Tmux, record: SupervisorState | None) -> PaneInfo | None:
    """The pane on our socket. A socket deleted while no supervisor watched is made again
    first, when the recorded tmux server is still that process."""
    sock = tmux.socket_path
    server = record.tmux if record is not None else None
    if (
        not sock.exists()
        and server is not None
        and send_signal(server.pid, server.start, signal.SIGUSR1)
    ):
        deadline = time.monotonic() + SOCKET_BACK_WITHIN
        # A file appearing has no event to wait on (no inotify here): polled, bounded.
        while not sock.exists() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return await asyncio.to_thread(tmux.find_pane)


def _recreate(server: ProcRef) -> bool:
    """tmux recreates its socket on SIGUSR1: sent only if the recorded server is that process."""
    return send_signal(server.pid, server.start, signal.SIGUSR1)


def found_text(live: PaneInfo | None) -> str:
    return "no tmux session" if live is None else f"tmux {live.server_pid} pane {live.pane_pid}"
