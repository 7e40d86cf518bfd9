"""The bwrap runtime: the sidecar as PID 1 in bubblewrap, under a waiter, on the host's Python.

bwrap gets a clean environment (the API keys and `--secret` values stay out of its argv) and
the token files and the secrets file from pipes (`--ro-bind-data`); the system is bound
read-only and the network namespace is shared, so the API listens on a host loopback port.
Resource limits need a systemd scope.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.core.proc import send_signal, start_time
from sidecar.launcher.fsutil import FILE_MODE, LauncherError, private_dir
from sidecar.launcher.plan import (
    SANDBOX_HOME,
    SECRETS_FILE,
    STATE_DIR,
    TOKEN_DIR,
    WORKSPACE,
    Command,
    Limits,
    RunPlan,
    fixed_env,
    home_mounts,
    token_files,
)
from sidecar.launcher.runtime import POLL_INTERVAL, Reality, Runtime
from sidecar.launcher.state import RUNNING, STOPPED, VANISHED, Run, StateStore, process_alive
from sidecar.launcher.waiter import WATCHED, waiter_argv

logger = logging.getLogger(__name__)

FIRST_FD = 3  # the descriptor the first of `bwrap_files` arrives on (then 4, ...)
SANDBOX_PATH_TAIL = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


@dataclass(frozen=True)
class HostPython:
    """Where the host's Python lives, so the sandbox can run the installed sidecar read-only."""

    executable: str
    prefixes: tuple[Path, ...]
    package_root: Path | None  # set when `sidecar` is not inside one of the prefixes

    @classmethod
    def current(cls) -> HostPython:
        exe_real = Path(os.path.realpath(sys.executable))
        candidates = [Path(sys.prefix), Path(sys.base_prefix), exe_real.parent.parent]
        prefixes: list[Path] = []
        for cand in candidates:
            real = cand.resolve()
            for path in (cand, real):
                if path not in prefixes:
                    prefixes.append(path)
        import sidecar  # the package we are part of; where it lives decides PYTHONPATH

        pkg_root = Path(sidecar.__file__).resolve().parent.parent
        inside = any(pkg_root.is_relative_to(p) for p in prefixes)
        return cls(sys.executable, tuple(prefixes), None if inside else pkg_root)


def host_tmux_dir(path: str | None = None) -> Path | None:
    """The folder of the tmux on the launcher's PATH (`path`: another PATH) when the sandbox
    would not see it otherwise (it is not under /usr or /bin): bound read-only and first on the
    sandbox's PATH after Python's, so that a sleeve runs the tmux its user runs (a newer one
    than the system's, docs/tmux.md). None: the system's tmux serves."""
    found = shutil.which("tmux", path=path)
    if found is None:
        return None
    folder = Path(found).parent
    if any(folder.is_relative_to(top) for top in ("/usr", "/bin", "/sbin")):
        return None
    return folder


def _system_binds() -> list[str]:
    argv = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    # Merged-/usr systems have /bin -> usr/bin etc.; mirror whatever the host has.
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    return argv


def bwrap_argv(plan: RunPlan, python: HostPython) -> list[str]:
    """`bwrap ... python -m sidecar run`: the sidecar as PID 1, the system read-only.

    The network namespace is shared on purpose: the API listens on a host loopback port.
    bwrap applies mounts in order and the last one wins, so the overlays follow the config dir.
    """
    argv = ["bwrap", "--unshare-pid", "--as-pid-1", "--die-with-parent"]
    argv += _system_binds()
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/run"]  # noqa: S108 - a fresh tmpfs inside the sandbox
    argv += ["--dir", STATE_DIR, "--tmpfs", "/home", "--dir", SANDBOX_HOME]
    resolv = os.path.realpath("/etc/resolv.conf")
    if resolv.startswith("/run/"):  # systemd-resolved: keep DNS working under the /run tmpfs
        argv += ["--ro-bind-try", os.path.dirname(resolv), os.path.dirname(resolv)]
    bound: list[Path] = [Path("/usr"), Path("/etc")]
    # Only the package dir, not the whole checkout, when running from a source tree.
    package = [python.package_root / "sidecar"] if python.package_root else []
    tmux = host_tmux_dir()
    for path in [*package, *python.prefixes, *([tmux] if tmux else [])]:
        if not any(path.is_relative_to(b) for b in bound):
            argv += ["--ro-bind", str(path), str(path)]
            bound.append(path)
    for mount in home_mounts(plan):
        argv += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
    files = bwrap_files(plan)
    if files:
        argv += ["--perms", "0700", "--dir", TOKEN_DIR]
    for fd, name in enumerate(sorted(files), FIRST_FD):
        argv += ["--perms", "0400", "--ro-bind-data", str(fd), f"{TOKEN_DIR}/{name}"]
    argv += ["--chdir", WORKSPACE, "--", python.executable, "-m", "sidecar", "run"]
    return [*systemd_scope(plan.limits), *argv]


def systemd_scope(limits: Limits) -> list[str]:
    """bwrap's resource limits: a transient systemd scope (a cgroup) around it; [] without
    limits. The caller has checked that systemd runs (`systemd_problem`)."""
    if not limits.any:
        return []
    argv = ["systemd-run", "--scope", "--quiet", "--collect"]
    if os.geteuid() != 0:
        argv.insert(1, "--user")
    if limits.cpus is not None:
        argv += ["--property", f"CPUQuota={limits.cpus * 100:g}%"]
    if limits.memory is not None:
        argv += ["--property", f"MemoryMax={limits.memory}"]
    if limits.pids is not None:
        argv += ["--property", f"TasksMax={limits.pids}"]
    return [*argv, "--"]


def systemd_problem(root: Path = Path("/")) -> str | None:
    """Why `systemd-run --scope` cannot be used here, or None (sd_booted's test)."""
    if not (root / "run" / "systemd" / "system").is_dir():
        return "this machine does not run systemd"
    if shutil.which("systemd-run") is None:
        return "systemd-run is not installed"
    return None


def bwrap_env(plan: RunPlan, python: HostPython) -> dict[str, str]:
    """The sandbox's whole environment; bwrap is started with exactly this (see module doc).

    bwrap's `--clearenv --setenv NAME VALUE` would put API keys into argv, which every user
    can read in /proc/PID/cmdline; handing bwrap a clean environment has the same effect.
    """
    env = dict(plan.passthrough)
    env.update(fixed_env(plan, port=plan.port, host="127.0.0.1"))
    tmux = host_tmux_dir()
    env["PATH"] = ":".join(
        [str(Path(python.executable).parent), *([str(tmux)] if tmux else []), SANDBOX_PATH_TAIL]
    )
    env.setdefault("TERM", "xterm-256color")
    env.setdefault("LANG", "C.UTF-8")
    if python.package_root is not None:
        env["PYTHONPATH"] = str(python.package_root)
    # One uid runs the whole sandbox, so a file the sidecar can read the CLI could read too:
    # each `--secret` travels in the sidecar's own environment (from_env), which it removes
    # from every process it starts.
    for secret in plan.secrets:
        env[secret.from_env] = secret.value
    return env


def bwrap_files(plan: RunPlan) -> dict[str, bytes]:
    """The files bwrap makes in TOKEN_DIR from pipes: the token files and the secrets file."""
    from sidecar.launcher.secretopts import secrets_yaml  # only a run with --secret needs it

    files = token_files(plan)
    if plan.secrets:
        files[SECRETS_FILE.rsplit("/", 1)[1]] = secrets_yaml(plan.secrets, None).encode()
    return files


def bwrap_command(plan: RunPlan, python: HostPython) -> Command:
    env = bwrap_env(plan, python)
    files = bwrap_files(plan)
    fds = {fd: files[name] for fd, name in enumerate(sorted(files), FIRST_FD)}
    return Command(bwrap_argv(plan, python), env, sorted(env), fds=fds)


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


class Bwrap(Runtime):
    """A sleeve is bwrap under a waiter process that records its exit code in state.json."""

    name = "bwrap"
    uses_containers = False
    look_interval = 0.0  # a look is a read of /proc

    def problem(self) -> str | None:
        if shutil.which("bwrap") is None:
            return "runtime bwrap: bwrap is not installed (apt-get install bubblewrap)"
        return None

    def check_limits(self, limits: Limits) -> None:
        if limits.any and (problem := systemd_problem()) is not None:
            msg = (
                f"--cpus, --memory and --pids-limit with the bwrap runtime need a systemd scope "
                f"(systemd-run --scope), but {problem}; use --runtime docker, or run without limits"
            )
            raise LauncherError(msg)

    def user(self) -> tuple[int, int] | None:
        return None  # everything in the sandbox already runs as the invoking user

    def command(self, run: Run, plan: RunPlan, home: Path, host_env: Mapping[str, str]) -> Command:
        """The waiter wrapped around `bwrap ...`."""
        run.log = str(home / "logs" / f"{run.project}-{run.slot}-{run.id}.log")
        inner = bwrap_command(plan, HostPython.current())
        argv = waiter_argv(sys.executable, run, home, inner.argv)
        return Command(argv, inner.env, inner.env_names, fds=inner.fds)

    def start(self, run: Run, plan: RunPlan, command: Command) -> None:
        assert run.log is not None
        run.pid, run.pid_start = spawn_detached(
            command.argv, command.env, Path(run.log), command.fds
        )

    def starting(self, run: Run) -> bool:
        return run.pid is not None and process_alive(run.pid, run.pid_start)

    def may_be_running(self, run: Run) -> bool:
        return self.starting(run)

    def stop(self, home: Path, run: Run, grace: float) -> None:
        """SIGTERM via the waiter, SIGKILL after `grace`; only ever to the very process
        recorded (a run without its start time is not signalled: its pid names nothing sure)."""
        pid, start = run.pid, run.pid_start
        if pid is not None and start is not None and process_alive(pid, start):
            # The waiter forwards it to the sandbox's PID 1 (it may end by itself meanwhile).
            send_signal(pid, start, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while process_alive(pid, start) and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL)
            if process_alive(pid, start):
                logger.warning("run %s did not stop within %g s; killing it", run.id, grace)
                # Killing the waiter kills the sandbox too (bwrap --die-with-parent).
                send_signal(pid, start, signal.SIGKILL)
        # The waiter normally records `stopped` with the exit code; if it could not, we asked
        # for the stop and the process is gone, so `stopped` is still the truth.
        StateStore(home).advance(run.id, STOPPED)

    def refresh(self, run: Run, reality: Reality) -> None:
        if run.pid is None or not reality.alive(run.pid, run.pid_start):
            # The waiter records the exit code before it exits; no code means it was killed.
            run.status = VANISHED  # RUNNING -> failed (vanished)
        else:
            run.status = RUNNING

    def unrecorded(self, runs: Sequence[Run], reality: Reality) -> list[Run]:
        """Live waiters no record names (a waiter carries its run id in its argv)."""
        recorded = {r.id for r in runs}
        return [waiter for waiter in reality.waiters if waiter.id not in recorded]


BWRAP = Bwrap()
