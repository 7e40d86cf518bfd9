"""The docker runtime: the `docker create`, `docker cp` and `docker start` a sleeve is.

Host variables reach the container by name (`--env NAME`); the token files, and `--secret`'s
secrets file and values, are copied into the created container (root's, 0600) before it
starts, so not even `docker inspect` shows them.
The CLI runs as the invoking host user: the container starts as root with `SIDECAR_USER=uid:gid`,
every capability dropped but the three the sidecar needs to switch to that user and to signal
its processes, and no-new-privileges.
"""

from __future__ import annotations

import csv
import io
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sidecar.launcher import engine
from sidecar.launcher.engine import Container
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.plan import (
    CONTAINER_PORT,
    SANDBOX_HOME,
    SECRETS_DIR,
    SECRETS_FILE,
    TOKEN_DIR,
    WORKSPACE,
    Command,
    Limits,
    Mount,
    RunPlan,
    fixed_env,
    home_mounts,
    token_files,
)
from sidecar.launcher.runtime import Reality, Runtime
from sidecar.launcher.state import RUNNING, STARTING, VANISHED, Run, final_status

#: The capabilities a root sidecar with SIDECAR_USER needs (everything else is dropped): switch
#: the children to the user (uid, gid, groups) and signal the user's processes. Measured by
#: tests/e2e/test_e2e_privileges.py: the sleeve works with these and fails without any one.
DOCKER_CAPS = ("SETUID", "SETGID", "KILL")
# docker's container states in which the sleeve runs (its processes exist).
UP = frozenset({"running", "restarting", "paused"})


def _mount_flag(mount: Mount) -> str:
    # `-v a:b` breaks on a `:` in a path; --mount is CSV, so quote fields the csv way.
    fields = ["type=bind", f"source={mount.source}", f"target={mount.target}"]
    if not mount.writable:
        fields.append("readonly")
    buf = io.StringIO()
    # The csv module quotes a field holding a newline only if the newline could end a row.
    csv.writer(buf, lineterminator="\r\n").writerow(fields)
    return buf.getvalue().removesuffix("\r\n")


def docker_labels(plan: RunPlan) -> dict[str, str]:
    """The container's labels: how `docker ps` finds it, and `_adopted` reads it back."""
    return {
        engine.HOME_LABEL: plan.home_label,
        engine.PROJECT_LABEL: plan.project_key,
        engine.SLOT_LABEL: str(plan.slot_index),
        engine.SLOT_ID_LABEL: plan.slot_id,
        engine.CLI_LABEL: plan.cli,
        engine.PORT_LABEL: str(plan.port),
    }


def _adopted(box: Container) -> Run:
    """The record of a running container of ours that no record names, from its labels."""
    labels = box.labels
    port = labels.get(engine.PORT_LABEL, "")
    slot = labels.get(engine.SLOT_LABEL, "")
    return Run(
        id=f"adopted-{box.name}",
        project=labels.get(engine.PROJECT_LABEL, "?"),
        slot=int(slot) if slot.isdigit() else 0,
        slot_id=labels.get(engine.SLOT_ID_LABEL, "?"),
        runtime=Docker.name,
        cli=labels.get(engine.CLI_LABEL, "?"),
        port=int(port) if port.isdigit() else None,
        container=box.name,
        status=RUNNING,
        adopted=True,
    )


def docker_env(plan: RunPlan) -> dict[str, str | None]:
    """The container's variables; None means `--env NAME`: docker copies the client's value."""
    if plan.network_host:
        fixed = fixed_env(plan, port=plan.port, host="127.0.0.1")
    else:  # all interfaces of the container's own network; published on 127.0.0.1 only
        fixed = fixed_env(plan, port=CONTAINER_PORT, host="0.0.0.0")  # noqa: S104
    if plan.user is not None:
        fixed["SIDECAR_USER"] = f"{plan.user[0]}:{plan.user[1]}"
        fixed["SIDECAR_USER_HOME"] = SANDBOX_HOME
    env: dict[str, str | None] = {k: None for k in sorted(plan.passthrough) if k not in fixed}
    env.update(fixed)
    return env


def docker_argv(plan: RunPlan) -> list[str]:
    """`docker create ...` for the sidecar image; no --privileged, API on 127.0.0.1 only."""
    argv = ["docker", "create", "--name", plan.name]
    for key, value in docker_labels(plan).items():
        argv += ["--label", f"{key}={value}"]
    argv += ["--user", "0:0"]  # the sidecar starts as root; SIDECAR_USER is the CLI's user
    # What any `docker stop` (the engine's own at its shutdown too) gives the sleeve.
    argv += ["--stop-timeout", str(plan.stop_timeout)]
    if plan.user is not None:
        argv += ["--cap-drop", "ALL"]
        for cap in DOCKER_CAPS:
            argv += ["--cap-add", cap]
        argv += ["--security-opt", "no-new-privileges"]
    if plan.limits.cpus is not None:
        argv += ["--cpus", f"{plan.limits.cpus:g}"]
    if plan.limits.memory is not None:
        argv += ["--memory", str(plan.limits.memory)]
    if plan.limits.pids is not None:
        argv += ["--pids-limit", str(plan.limits.pids)]
    if plan.network_host:
        argv += ["--network", "host"]
    else:
        argv += ["--publish", f"127.0.0.1:{plan.port}:{CONTAINER_PORT}"]
    if plan.user is not None:
        # The user's own HOME (the image's /home/sleeve is uid 1000's); the slot's config dirs
        # are mounted into it below.
        uid, gid = plan.user
        argv += ["--tmpfs", f"{SANDBOX_HOME}:uid={uid},gid={gid},mode=0700,exec"]
    for mount in home_mounts(plan):
        argv += ["--mount", _mount_flag(mount)]
    for name, setting in docker_env(plan).items():
        argv += ["--env", name if setting is None else f"{name}={setting}"]
    argv += ["--workdir", WORKSPACE, plan.image]
    return argv


def sleeve_files(plan: RunPlan) -> dict[str, bytes]:
    """What goes into TOKEN_DIR before the start, by path in it: the token files, and with
    `--secret` the secrets file and each value's file (read by the root sidecar only)."""
    from sidecar.launcher.secretopts import secrets_yaml  # only a run with --secret needs it

    files = token_files(plan)
    if plan.secrets:
        files[SECRETS_FILE.rsplit("/", 1)[1]] = secrets_yaml(plan.secrets, SECRETS_DIR).encode()
        for secret in plan.secrets:
            files[f"secrets/{secret.name}"] = secret.value.encode()
    return files


def sleeve_archive(files: Mapping[str, bytes]) -> bytes:
    """`files` as a tar for `docker cp -` into /run: run/sleeve/ and its folders 0700, files
    0600, all root's (docker cp gives them the container's root), so the CLI's user reads none."""
    buf = io.BytesIO()
    top = TOKEN_DIR.rsplit("/", 1)[1]
    folders = sorted({top} | {f"{top}/{p.rsplit('/', 1)[0]}" for p in files if "/" in p})
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in folders:
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(folder)
        for path in sorted(files):
            info = tarfile.TarInfo(f"{top}/{path}")
            info.size, info.mode = len(files[path]), 0o600
            tar.addfile(info, io.BytesIO(files[path]))
    return buf.getvalue()


def check_secrets(plan: RunPlan) -> None:
    """A `--secret` needs the CLI to run as another user than the root sidecar: a CLI that is
    root itself could read the value's file."""
    if plan.secrets and plan.user is None:
        msg = (
            "--secret with the docker runtime needs the CLI to run as a user other than root, "
            "and the launcher runs it as you (root): run sleeve as an ordinary user, or use "
            "--runtime bwrap"
        )
        raise LauncherError(msg)


def docker_command(plan: RunPlan, client_env: Mapping[str, str]) -> Command:
    check_secrets(plan)
    then: list[list[str]] = []
    stdin: dict[int, bytes] = {}
    files = sleeve_files(plan)
    if files:
        then.append(["docker", "cp", "-", f"{plan.name}:{TOKEN_DIR.rsplit('/', 1)[0]}"])
        stdin[len(then)] = sleeve_archive(files)
    then.append(["docker", "start", plan.name])
    env_names = list(docker_env(plan))
    return Command(docker_argv(plan), dict(client_env), env_names, tuple(then), stdin)


class Docker(Runtime):
    """A sleeve is a container of the sidecar image; the engine keeps its state."""

    name = "docker"
    uses_containers = True
    look_interval = 1.0  # a `docker inspect` is a process and an engine round trip

    def problem(self) -> str | None:
        return engine.engine_problem()

    def check_limits(self, limits: Limits) -> None:
        """The engine applies every limit itself."""

    def user(self) -> tuple[int, int] | None:
        # The CLI runs as the invoking user (as root when that is who runs us).
        return (os.getuid(), os.getgid()) if os.getuid() != 0 else None

    def command(self, run: Run, plan: RunPlan, home: Path, host_env: Mapping[str, str]) -> Command:
        return docker_command(plan, host_env)

    def start(self, run: Run, plan: RunPlan, command: Command) -> None:
        run.container = plan.name
        engine.remove_stopped(plan.name)
        try:
            for i, step in enumerate(command.steps):
                engine.run(step, command.env, command.stdin.get(i))
        except LauncherError:
            engine.remove_stopped(plan.name)  # created but not started: leave nothing behind
            raise

    def starting(self, run: Run) -> bool:
        return engine.container_state(run.container or "") in ("created", "running", "restarting")

    def may_be_running(self, run: Run) -> bool:
        return True  # only the engine knows, and asking it costs as much as the stop

    def stop(self, home: Path, run: Run, grace: float) -> None:
        # The record follows at the next look: the container's exit code, with stop_requested.
        engine.stop(run.container or "", grace=int(grace))

    def refresh(self, run: Run, reality: Reality) -> None:
        if reality.containers is None:
            return  # docker cannot tell: as recorded
        box = reality.containers.get(run.container or "")
        if box is None:
            run.status = VANISHED
        elif box.state in UP:
            run.status = RUNNING
        elif box.state == "created":
            run.status = STARTING
        else:  # exited or dead
            run.exit_code = box.exit_code
            if box.exit_code is None:
                run.status = VANISHED
            else:
                run.status = final_status(box.exit_code, stop_requested=run.stop_requested)

    def unrecorded(self, runs: Sequence[Run], reality: Reality) -> list[Run]:
        """Running containers of ours that no record names (state lost, or written by another
        sleeve process that died before recording it)."""
        if reality.containers is None:
            return []
        named = {r.container for r in runs if r.runtime == self.name and r.container}
        return [
            _adopted(box)
            for box in reality.containers.values()
            if box.name not in named and box.state in UP
        ]


DOCKER = Docker()
