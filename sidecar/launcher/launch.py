"""Around a sleeve's start and stop: what runs now, slot choice, ports, /health, stop.

What differs per runtime is asked of the run's `Runtime` object; state changes go through
`state`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from sidecar.core.contract import runtime_grace
from sidecar.launcher import engine
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.runtime import POLL_INTERVAL
from sidecar.launcher.runtimes import in_containers, reconcile, runtime_of
from sidecar.launcher.slots import Project, Slot, SlotState
from sidecar.launcher.state import RUNNING, STARTING, Run, StateStore, running_slots
from sidecar.launcher.waiter import find_waiters

logger = logging.getLogger(__name__)


def observe(
    home: Path, *, docker: bool, adopt_bwrap: bool = False, read_only: bool = False
) -> list[Run]:
    """Recorded runs reconciled with reality, written back unless `read_only`: at most one
    `docker ps`."""
    containers = engine.list_containers(home) if docker else None
    orphans = find_waiters(home) if adopt_bwrap else []
    store = StateStore(home, read_only=read_only)
    if not store.path.exists() and not containers and not orphans:
        return []  # nothing recorded, nothing found: a listing creates no files
    with store.transaction() as runs:
        reconcile(runs, containers, orphans=orphans)
        if docker and containers is None and any(r.active and in_containers(r) for r in runs):
            logger.warning("runtime docker is not answering; docker sleeves shown as last recorded")
        return list(runs)


def docker_in_use(home: Path, env: Mapping[str, str]) -> bool:
    """Ask docker only if it could know something: a client exists and we have used it
    (or DOCKER_HOST says an engine is meant to be there)."""
    if shutil.which("docker") is None:
        return False
    return bool(env.get("DOCKER_HOST")) or any(in_containers(r) for r in StateStore(home).peek())


def check_port(port: int) -> int:
    """`port` if nothing listens on 127.0.0.1:port, else a LauncherError that says so."""
    if not 1 <= port <= 65535:
        msg = f"--port {port} is not a TCP port (1..65535)"
        raise LauncherError(msg)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            msg = (
                f"port {port} on 127.0.0.1 is already in use ({exc.strerror}); pick another --port"
            )
            raise LauncherError(msg) from exc
    return port


def pick_slot(project: Project, runs: list[Run], wanted: int | None, *, create: bool) -> Slot:
    """`--slot N`, else the first existing slot not running; slot 1 is made if none exist."""
    busy = running_slots(runs, project.key)
    if wanted is not None:
        slot = project.get(wanted)
        if slot.state is SlotState.DEAD:
            msg = f"slot {wanted} is dead (its directory is gone); `sleeve create` recreates it"
            raise LauncherError(msg)
        if wanted in busy:
            runtime = busy[wanted].runtime
            msg = f"slot {wanted} is already running ({runtime}); `sleeve stop {wanted}` stops it"
            raise LauncherError(msg)
        return slot
    alive = [s for s in project.slots(prune=create) if s.state is not SlotState.DEAD]
    if not alive:
        if not create:  # --dry-run: show what slot 1 would be, create nothing
            return project.unmade_slot(1)
        return project.create()
    for slot in alive:
        if slot.index not in busy:
            return slot
    msg = f"all {len(alive)} slots are running; `sleeve create` adds one"
    raise LauncherError(msg)


def await_health(home: Path, run: Run, deadline_s: float) -> str:
    """Wait for /health; on failure stop what is left and say why (with the log's tail)."""
    try:
        url = wait_healthy(run, deadline_s)
    except LauncherError as exc:
        if runtime_of(run).may_be_running(run):
            with contextlib.suppress(LauncherError):  # the start-up error is the one to report
                stop(home, run)
        raise LauncherError(str(exc) + _tail(run.log)) from exc
    StateStore(home).advance(run.id, RUNNING, only_from=frozenset({STARTING}))
    return url


def _tail(log: str | None, lines: int = 20) -> str:
    try:
        with open(log or "", errors="replace") as fh:
            tail = fh.readlines()[-lines:]
    except OSError:
        return ""
    return "\n" + "".join(f"  | {line}" for line in tail).rstrip("\n")


def wait_healthy(run: Run, deadline_s: float) -> str:
    """Poll the sleeve's /health until it answers 200, its process dies, or the deadline."""
    import urllib.request  # here, not at the top: it costs `sleeve slots` ~15 ms of imports

    runtime = runtime_of(run)
    url = f"http://127.0.0.1:{run.port}/"
    deadline = time.monotonic() + deadline_s
    next_look = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_look:  # a process check is cheap; `docker inspect` is not
            next_look = time.monotonic() + runtime.look_interval
            if not runtime.starting(run):
                where = run.log if run.log else f"`docker logs {run.container}`"
                msg = f"the sleeve exited during start-up; see {where}"
                raise LauncherError(msg)
        try:
            with urllib.request.urlopen(url + "health", timeout=2) as resp:  # noqa: S310 - fixed http://127.0.0.1 URL
                if resp.status == 200 and "status" in json.loads(resp.read()):
                    return url
        except (OSError, ValueError) as exc:  # not up yet: refused, reset, or half an answer
            logger.debug("health: %s", exc)
        time.sleep(POLL_INTERVAL)
    msg = f"the sleeve did not answer {url}health within {deadline_s:g} s"
    if run.log:
        msg += f"; see {run.log}"
    raise LauncherError(msg)


# How long `sleeve run` waits, after /health, for the sleeve to say whether its CLI runs.
CLI_WAIT = 10.0
CLI_DOWN = frozenset({"fatal", "exited", "backoff"})  # /status `cli_state`: it does not run


def await_cli(home: Path, run: Run, deadline_s: float = CLI_WAIT) -> None:
    """Wait for the sleeve's first word on its CLI (/status): running, or why not. A CLI that
    cannot run (not installed in the image or on the host, or exiting at once) stops the sleeve
    and is a LauncherError with the sleeve's reason; a sleeve that says nothing in time is left
    running (`sleeve ps` tells its agent's state later)."""
    from sidecar.launcher import agents  # urllib: imported by the commands that ask a sleeve

    assert run.port is not None
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            status = agents.get_json(run.port, run.token, "/status", 2)
        except (OSError, ValueError) as exc:  # restarting, or half an answer: ask again
            logger.debug("status: %s", exc)
            status = None
        state = status.get("cli_state") if isinstance(status, dict) else None
        if state == "running":
            return
        if state in CLI_DOWN:
            reason = agents.parse(status).reason or f"its state is {state}"
            with contextlib.suppress(LauncherError):  # the CLI's reason is the one to report
                stop(home, run, grace=5)
            msg = f"the sleeve started, but its CLI {run.cli} does not run: {reason}; stopped it"
            raise LauncherError(msg)
        time.sleep(POLL_INTERVAL)
    logger.info("the sleeve did not say within %g s whether its CLI runs", deadline_s)


def new_run_id() -> str:
    return time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)


def stop(home: Path, run: Run, grace: float | None = None) -> None:
    """Stop one active run and wait for it; a bwrap run gets SIGTERM via its waiter first.
    SIGKILL after `grace` seconds: by default what the run was started with, else what the
    stop-grace rule gives the sidecar's default grace."""
    if grace is None:
        grace = runtime_grace() if run.stop_timeout is None else run.stop_timeout
    runtime = runtime_of(run)
    StateStore(home).mark(run.id, stop_requested=True)
    runtime.stop(home, run, grace)
