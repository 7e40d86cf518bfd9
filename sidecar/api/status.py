"""`GET /health` and `GET /status`: the answers made from one snapshot of the supervisor
(`sidecar.api.view`) and, for /status, `.cstack/CURRENT.md` as it is now. No request forks a
process: /status costs the snapshot plus two `stat` calls.
"""

from __future__ import annotations

import contextlib
import os

from aiohttp import web

from sidecar.api import httpio, view
from sidecar.api.guard import ROLE
from sidecar.api.openapi import Operation
from sidecar.api.view import HealthView, SupervisorView
from sidecar.config import Config
from sidecar.core.contract import rfc3339
from sidecar.core.shapes import (
    Access,
    AgentInfo,
    DialogChoice,
    HealthAnswer,
    Progress,
    ScreenSize,
    StatusAnswer,
)
from sidecar.core.states import ProcState
from sidecar.process.supervisor import Supervisor
from sidecar.workspace.cstack import CurrentState


def health_answer(v: HealthView) -> HealthAnswer:
    return HealthAnswer(
        status="healthy" if v.healthy else "degraded", uptime=int(v.uptime), agent=v.agent
    )


def _last_activity(v: SupervisorView) -> str | None:
    times = [v.current_mtime]
    if v.pane_tty is not None:
        # The kernel stamps a tty's mtime when it is written (to within 8 s): the CLI's
        # last output, without asking tmux.
        with contextlib.suppress(OSError):
            times.append(os.stat(v.pane_tty).st_mtime)
    known = [t for t in times if t is not None]
    return rfc3339(max(known), ms=False) if known else None


def agent_info(v: SupervisorView) -> AgentInfo:
    agent = v.agent
    return AgentInfo(
        state=agent.state,
        since=rfc3339(agent.since),
        reason=agent.reason,
        source=agent.source,
        session_id=agent.session_id,
        choices=[DialogChoice(c.label, c.decision, c.remember) for c in agent.choices],
    )


def status_answer(
    v: SupervisorView, current: CurrentState, config: Config, access: Access = "read-write"
) -> StatusAnswer:
    """/status from a snapshot taken after CURRENT.md was read (`current`), for a caller whose
    token may do `access`."""
    running = v.cli.state is ProcState.RUNNING
    warnings = [*v.warnings, *current.warnings]
    for name, proc in (("CLI", v.cli), ("ttyd", v.ttyd)):
        if proc.state in (ProcState.FATAL, ProcState.BACKOFF) and proc.reason:
            warnings.append(f"{name}: {proc.reason}")
    return StatusAnswer(
        sleeve_id=config.sleeve_name,
        status=current.status,
        current_task=current.task,
        progress=Progress(total=current.progress_total, completed=current.progress_completed),
        blockers=list(current.blockers),
        next_steps=list(current.next_steps),
        cli=v.cli_name,
        cli_pid=v.cli.pid if running else None,
        cli_running=running,
        cli_state=v.cli.state,
        cli_exit_code=v.cli.exit_code,
        resleeving=v.resleeving,
        ttyd_state=v.ttyd.state,
        last_activity=_last_activity(v),
        health="healthy" if v.healthy else "degraded",
        repo=config.repo,
        warnings=warnings,
        sidecar_restarts=v.restarts,
        agent=agent_info(v),
        egress=v.egress,
        screen=ScreenSize(cols=v.screen[0], rows=v.screen[1]),
        access=access,
        usage=v.usage,
        notify=v.notify,
    )


def status_operations(sup: Supervisor) -> list[Operation]:
    async def health(request: web.Request) -> web.Response:
        return httpio.answer(health_answer(view.health_of(sup)))

    async def status(request: web.Request) -> web.Response:
        # CURRENT.md as it is now (a stat; parsed again only when it changed), then the snapshot.
        current = sup.current.get()
        access: Access = "read-only" if request.get(ROLE) == "viewer" else "read-write"
        return httpio.answer(status_answer(view.of(sup), current, sup.config, access))

    return [
        Operation(
            "GET",
            "/health",
            health,
            "getHealth",
            "status",
            "Liveness: 200 whenever the sidecar runs",
            {200: HealthAnswer},
            description="Never needs a token; `degraded` means the CLI is not running.",
            public=True,
        ),
        Operation(
            "GET",
            "/status",
            status,
            "getStatus",
            "status",
            "The sleeve's state: CURRENT.md, the CLI process and health",
            {200: StatusAnswer},
        ),
    ]
