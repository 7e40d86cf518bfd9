"""Taking over after a crash, the acting half: find the pane on our socket, look at what runs
(`observe`: the snapshot `sidecar.process.adopt.decide` decides on), and carry the plan out
through the runner's own methods, the ones every launch uses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from sidecar.core.proc import ppid, start_time
from sidecar.core.states import ProcState
from sidecar.pane.tmux import PaneInfo, Tmux
from sidecar.process import pane_procs
from sidecar.process.adopt import Observed, Plan
from sidecar.process.cli_runner import CliRunner
from sidecar.process.cli_status import CliStatus, of_record
from sidecar.process.persist import ProcRef, SupervisorState, cmdline_digest
from sidecar.process.tmux_server import recreate_socket

SOCKET_BACK_WITHIN = 1.0  # seconds tmux gets to recreate a deleted socket on SIGUSR1


async def find_pane(tmux: Tmux, record: SupervisorState | None) -> PaneInfo | None:
    """The pane on our socket. A socket deleted while no supervisor watched is made again
    first, when the recorded tmux server is still that process."""
    sock = tmux.socket_path
    server = record.tmux if record is not None else None
    if not sock.exists() and server is not None and recreate_socket(server):
        deadline = time.monotonic() + SOCKET_BACK_WITHIN
        # A file appearing has no event to wait on (no inotify here): polled, bounded.
        while not sock.exists() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return await asyncio.to_thread(tmux.find_pane)


def observe(live: PaneInfo | None, record: SupervisorState | None) -> Observed:
    """What /proc says of the pane tmux reported (`live`) and of the CLI `record` names."""
    if live is None:
        return Observed()
    cli = record.cli_pid if record is not None else None
    return Observed(
        live=live,
        server=ProcRef.of(live.server_pid),
        pane=ProcRef.of(live.pane_pid),
        pane_command=cmdline_digest(live.pane_pid),
        cli_parent=ppid(cli.pid) if cli is not None and cli.alive() else None,
    )


async def adopted(record: SupervisorState, live: PaneInfo) -> CliStatus:
    """The CLI's record to take over with the pane `live`: as `record` saved it, but for what
    happened after the save."""
    status = of_record(record)
    if status.state is ProcState.STARTING:
        # The launch went through but was not recorded: the CLI has just started.
        pid = await pane_procs.cli_pid(live.pane_pid)
        return replace(
            status,
            state=ProcState.RUNNING,
            pid=pid,
            started_at=time.monotonic(),
            process=ProcRef.of(pid),
        )
    if status.state is ProcState.STOPPING and record.resleeve_to is None:
        return replace(status, state=ProcState.RUNNING)  # only a resleeve leaves that state saved
    return status


async def carry_out(
    run: CliRunner, plan: Plan, record: SupervisorState | None, live: PaneInfo | None
) -> None:
    """Carry `plan` out (caller holds the runner's lock)."""
    if plan is Plan.FRESH or record is None:
        if live is not None:
            # Not ours to adopt, but on our socket: stopped, never left running.
            await run.stop_tree(live.pane_pid, start_time(live.pane_pid))
        await run.launch(resume=False, fresh_server=True)
    elif plan is Plan.ADOPT:
        assert live is not None
        run.adopt(await adopted(record, live), live)
    else:
        if plan is Plan.HEAL and record.pane is not None:
            # A CLI that ignores SIGHUP outlives its tmux server.
            await run.stop_tree(record.pane.pid, record.pane.start)
        elif plan is Plan.RELAUNCH:
            assert live is not None
            run.take(live, record.pane)
            await run.stop_pane_tree()
        await run.launch(
            resume=plan is Plan.HEAL or record.resume,
            fresh_server=plan is Plan.HEAL,
            cli=record.resleeve_to or record.cli,
            failures=record.backoff_n,
        )
