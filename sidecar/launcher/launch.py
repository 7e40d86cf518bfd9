"""Starting, watching and stopping sleeves: slot choice, ports, spawn, /health, stop.

The argv comes from `runtimes` and is executed as built; state changes go through `state`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.launcher import engine
from sidecar.launcher.bwrap import HostPython, bwrap_command
from sidecar.launcher.docker import docker_command
from sidecar.launcher.fsutil import FILE_MODE, LauncherError, private_dir
from sidecar.launcher.plan import Command, RunPlan
from sidecar.launcher.slots import Project, Slot, SlotState
from sidecar.launcher.state import (
    RUNNING,
    STARTING,
    STOPPED,
    Run,
    StateStore,
    process_alive,
    reconcile,
    running_slots,
)
from sidecar.launcher.waiter import WATCHED, find_waiters, waiter_argv
from sidecar.proc import start_time

logger = logging.getLogger(__name__)

POLL_INTERVAL = 0.1


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
        if docker and containers is None and any(r.active and r.runtime == "docker" for r in runs):
            logger.warning("runtime docker is not answering; docker sleeves shown as last recorded")
        return list(runs)


def docker_in_use(home: Path, env: Mapping[str, str]) -> bool:
    """Ask docker only if it could know something: a client exists and we have used it
    (or DOCKER_HOST says an engine is meant to be there)."""
    if shutil.which("docker") is None:
        return False
    return bool(env.get("DOCKER_HOST")) or any(
        r.runtime == "docker" for r in StateStore(home).peek()
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
            return Slot(1, project.slot_path(1).name, project.slot_path(1), SlotState.DEAD)
        return project.create()
    for slot in alive:
        if slot.index not in busy:
            return slot
    msg = f"all {len(alive)} slots are running; `sleeve create` adds one"
    raise LauncherError(msg)


def spawn_detached(
    argv: list[str], env: Mapping[str, str], log: Path, fds: Mapping[int, bytes] | None = None
) -> tuple[int, float | None]:
    """Start the waiter `argv` in a new session, output to a 0600 `log`, its stop signals
    blocked until it waits for them; returns its pid and start time. `fds`: pipes holding this
    data at those descriptor numbers (the token files bwrap copies in; read once, then empty)."""
    private_dir(log.parent)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
    actions: list[tuple[Any, ...]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, fd, 1),
        (os.POSIX_SPAWN_DUP2, fd, 2),
    ]
    readers = []
    try:
        for number, data in sorted((fds or {}).items()):
            read_end, write_end = os.pipe()  # a token is far below a pipe's 64 KiB: no block
            try:
                os.write(write_end, data)
            finally:
                os.close(write_end)
            readers.append(read_end)
            actions.append((os.POSIX_SPAWN_DUP2, read_end, number))
        # posix_spawn, not Popen: the child outlives us, and no Popen object is left to warn.
        pid = os.posix_spawn(
            argv[0], argv, dict(env), file_actions=actions, setsid=True, setsigmask=WATCHED
        )
    finally:
        os.close(fd)
        for read_end in readers:
            os.close(read_end)
    # None if already gone: the waiter's own record says how it ended.
    return pid, start_time(pid)


def choose_runtime(wanted: str | None, *, dry_run: bool) -> str:
    """`--runtime`, else docker when an engine answers (one `docker version`), else bwrap."""
    if wanted == "docker" and not dry_run:
        engine.require_engine()
    if wanted is None:
        problem = engine.engine_problem()
        if problem is None:
            return "docker"
        logger.warning("%s; using the bwrap runtime", problem.split(";")[0])
        wanted = "bwrap"
    if wanted == "bwrap" and not dry_run and shutil.which("bwrap") is None:
        msg = "runtime bwrap: bwrap is not installed (apt-get install bubblewrap)"
        raise LauncherError(msg)
    return wanted


def command_for(run: Run, plan: RunPlan, home: Path, host_env: Mapping[str, str]) -> Command:
    """What `run` executes: `docker run ...`, or the bwrap waiter wrapped around `bwrap ...`."""
    if run.runtime == "docker":
        return docker_command(plan, host_env)
    run.log = str(home / "logs" / f"{run.project}-{run.slot}-{run.id}.log")
    inner = bwrap_command(plan, HostPython.current())
    argv = waiter_argv(sys.executable, run, home, inner.argv)
    return Command(argv, inner.env, inner.env_names, fds=inner.fds)


def start(run: Run, plan: RunPlan, command: Command) -> None:
    """Execute `command` for `run`, filling in what identifies it (container, or pid + start)."""
    if run.runtime == "docker":
        run.container = plan.name
        engine.remove_stopped(plan.name)
        try:
            for i, step in enumerate(command.steps):
                engine.run(step, command.env, command.stdin.get(i))
        except LauncherError:
            engine.remove_stopped(plan.name)  # created but not started: leave nothing behind
            raise
    else:
        assert run.log is not None
        run.pid, run.pid_start = spawn_detached(
            command.argv, command.env, Path(run.log), command.fds
        )


def await_health(home: Path, run: Run, deadline_s: float) -> str:
    """Wait for /health; on failure stop what is left and say why (with the log's tail)."""
    try:
        url = wait_healthy(run, deadline_s)
    except LauncherError as exc:
        alive = run.pid is not None and process_alive(run.pid, run.pid_start)
        if run.runtime == "docker" or alive:
            with contextlib.suppress(LauncherError):  # the start-up error is the one to report
                stop(home, run, grace=5)
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

    url = f"http://127.0.0.1:{run.port}/"
    deadline = time.monotonic() + deadline_s
    next_look = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() >= next_look:  # a process check is cheap; `docker inspect` is not
            next_look = time.monotonic() + (1.0 if run.runtime == "docker" else 0.0)
            if not _still_starting(run):
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


def _still_starting(run: Run) -> bool:
    if run.runtime == "docker":
        return engine.container_state(run.container or "") in ("created", "running", "restarting")
    return run.pid is not None and process_alive(run.pid, run.pid_start)


def new_run_id() -> str:
    return time.strftime("%Y%m%d%H%M%S") + "-" + secrets.token_hex(3)


def stop(home: Path, run: Run, grace: float = 15.0) -> None:
    """Stop one active run and wait for it; a bwrap run gets SIGTERM via its waiter first."""
    store = StateStore(home)
    store.mark(run.id, stop_requested=True)
    if run.runtime == "docker":
        engine.stop(run.container or "", grace=int(grace))
        return
    pid = run.pid
    if pid is not None and process_alive(pid, run.pid_start):
        with contextlib.suppress(ProcessLookupError):  # it may end by itself meanwhile
            os.kill(pid, signal.SIGTERM)  # the waiter forwards it to the sandbox's PID 1
        deadline = time.monotonic() + grace
        while process_alive(pid, run.pid_start) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        if process_alive(pid, run.pid_start):
            logger.warning("run %s did not stop within %g s; killing it", run.id, grace)
            # Killing the waiter kills the sandbox too (bwrap --die-with-parent).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    # The waiter normally records `stopped` with the exit code; if it could not, we asked
    # for the stop and the process is gone, so `stopped` is still the truth.
    store.advance(run.id, STOPPED)
