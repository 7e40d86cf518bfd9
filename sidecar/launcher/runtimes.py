"""argv builders for the two runtimes (docker, bwrap) and the mount/env plan they share.

`sleeve run` executes exactly the lists built here and `--dry-run` prints those same lists, so
the two cannot drift. The builders are pure but for a look at the host's layout (/bin symlinks,
where Python lives). Secrets never enter an argv: variables copied from the host go by name
(docker `-e NAME`) or through the process environment (bwrap), never `NAME=value` on a line;
the sleeve's API tokens go in as files (docker: copied into the created container, root's and
0600, before it starts; bwrap: `--ro-bind-data` from a pipe), so not even `docker inspect`
shows them.

Docker runs the CLI as the invoking host user: the container starts as root with
`SIDECAR_USER=uid:gid`, every capability dropped but the three the sidecar needs to switch to
that user and to signal its processes, and no-new-privileges.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.launcher import engine

SANDBOX_HOME = "/home/sleeve"
WORKSPACE = "/workspace"
STATE_DIR = "/run/sidecar"
CONTAINER_PORT = 8080  # the sidecar's default; docker publishes it on 127.0.0.1:<port>
#: Inside a sleeve: the API token files (root's, 0700, in the container).
TOKEN_DIR = "/run/sleeve"  # noqa: S105 - a path, not a password
TOKEN_FILES = {"SIDECAR_TOKEN": "token", "SIDECAR_VIEW_TOKEN": "view-token"}
#: The capabilities a root sidecar with SIDECAR_USER needs (everything else is dropped): switch
#: the children to the user (uid, gid, groups) and signal the user's processes. Measured by
#: tests/e2e/test_e2e_privileges.py: the sleeve works with these and fails without any one.
DOCKER_CAPS = ("SETUID", "SETGID", "KILL")
SANDBOX_PATH_TAIL = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

# Copied from the host when set. Values stay out of argv; `sleeve run --dry-run` names them.
PASSTHROUGH = (
    "TERM",
    "LANG",
    "LC_ALL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "OPENROUTER_API_KEY",
)
PASSTHROUGH_PREFIXES = ("SLEEVE_", "SIDECAR_")
# Host-side launcher settings that mean nothing inside a sleeve, and what the launcher decides
# itself (the tokens go in as files; the CLI's user is the invoking one).
HOST_ONLY = frozenset(
    {
        "SLEEVE_HOME",
        "SIDECAR_TOKEN",
        "SIDECAR_VIEW_TOKEN",
        "SIDECAR_TOKEN_FILE",
        "SIDECAR_VIEW_TOKEN_FILE",
        "SIDECAR_USER",
        "SIDECAR_USER_HOME",
    }
)


@dataclass(frozen=True)
class Limits:
    """`--cpus`, `--memory` (bytes), `--pids-limit`."""

    cpus: float | None = None
    memory: int | None = None
    pids: int | None = None

    @property
    def any(self) -> bool:
        return (self.cpus, self.memory, self.pids) != (None, None, None)


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    writable: bool = True


@dataclass(frozen=True)
class RunPlan:
    """Everything a runtime needs to start one sleeve; built once, rendered per runtime."""

    name: str  # container name `sleeve-<slug>_<crc0>-<crcN>`
    project_key: str
    home_label: str  # tells apart sleeves of different $SLEEVE_HOMEs on one engine
    slot_index: int
    slot_id: str
    workspace: Path
    slot_dir: Path
    instance_dir: Path
    cli: str
    goal: str | None
    port: int
    image: str = "sleeve:latest"
    network_host: bool = False
    passthrough: Mapping[str, str] = field(default_factory=dict)
    # docker: the invoking host user (uid, gid) the CLI runs as; None when that is root.
    user: tuple[int, int] | None = None
    limits: Limits = Limits()
    # The sleeve's API tokens (SIDECAR_TOKEN, SIDECAR_VIEW_TOKEN): handed in as files.
    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)


def home_mounts(plan: RunPlan) -> list[Mount]:
    """The shared mount plan, in order: later mounts sit on top of earlier ones.

    The slot's `.claude/` is the CLI's config dir (read-write: OAuth refresh rewrites the
    credentials file); the instance's `projects/` and `history.jsonl` go over the config dir's
    own, so history belongs to the project and survives a hard resleeve.
    """
    claude = f"{SANDBOX_HOME}/.claude"
    return [
        Mount(plan.workspace, WORKSPACE),
        Mount(plan.slot_dir / ".claude", claude),
        Mount(plan.instance_dir / "projects", f"{claude}/projects"),
        Mount(plan.instance_dir / "history.jsonl", f"{claude}/history.jsonl"),
        Mount(plan.slot_dir / ".claude.json", f"{SANDBOX_HOME}/.claude.json"),
        Mount(plan.slot_dir / ".config", f"{SANDBOX_HOME}/.config"),
        Mount(plan.slot_dir / ".cache", f"{SANDBOX_HOME}/.cache"),
    ]


def passthrough_env(host_env: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed host variables a sleeve may see."""
    return {
        k: v
        for k, v in host_env.items()
        if k not in HOST_ONLY and (k in PASSTHROUGH or k.startswith(PASSTHROUGH_PREFIXES))
    }


def fixed_env(plan: RunPlan, *, port: int, host: str) -> dict[str, str]:
    """The variables the launcher chooses; they win over anything passed through. (TTYD_PORT
    stays unset: ttyd listens on a unix socket only the sidecar reaches.)"""
    env = {
        "HOME": SANDBOX_HOME,
        "SLEEVE_NAME": plan.slot_id,
        "SLEEVE_CLI": plan.cli,
        "SIDECAR_HOST": host,
        "SIDECAR_PORT": str(port),
        "SIDECAR_WORKSPACE": WORKSPACE,
        "SIDECAR_STATE_DIR": STATE_DIR,
    }
    for var in sorted(plan.tokens):
        env[f"{var}_FILE"] = f"{TOKEN_DIR}/{TOKEN_FILES[var]}"
    if plan.goal is not None:
        env["SLEEVE_GOAL"] = plan.goal
    return env


# -- docker ----------------------------------------------------------------------------


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
    return {
        engine.HOME_LABEL: plan.home_label,
        engine.PROJECT_LABEL: plan.project_key,
        engine.SLOT_LABEL: str(plan.slot_index),
        engine.SLOT_ID_LABEL: plan.slot_id,
        engine.CLI_LABEL: plan.cli,
        engine.PORT_LABEL: str(plan.port),
    }


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


def token_archive(tokens: Mapping[str, str]) -> bytes:
    """The token files as a tar for `docker cp -`: run/sleeve/ 0700 and its files 0600, root's."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        folder = tarfile.TarInfo(TOKEN_DIR.rsplit("/", 1)[1])
        folder.type, folder.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(folder)
        for var in sorted(tokens):
            data = (tokens[var] + "\n").encode()
            info = tarfile.TarInfo(f"{folder.name}/{TOKEN_FILES[var]}")
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass(frozen=True)
class Command:
    """What `sleeve run` executes, in order: `argv`, then each of `then`. `env` is what they run
    with, `env_names` the variables the sleeve sees. `stdin` is fed to the step of that index
    (docker: the token files' tar); `fds` are pipes holding that data at those descriptor
    numbers in the started process (bwrap: the token files). Neither is ever printed."""

    argv: list[str]
    env: dict[str, str]
    env_names: list[str]
    then: tuple[list[str], ...] = ()
    stdin: Mapping[int, bytes] = field(default_factory=dict, repr=False)
    fds: Mapping[int, bytes] = field(default_factory=dict, repr=False)

    @property
    def steps(self) -> list[list[str]]:
        return [self.argv, *self.then]


def docker_command(plan: RunPlan, client_env: Mapping[str, str]) -> Command:
    then: list[list[str]] = []
    stdin: dict[int, bytes] = {}
    if plan.tokens:
        then.append(["docker", "cp", "-", f"{plan.name}:{TOKEN_DIR.rsplit('/', 1)[0]}"])
        stdin[len(then)] = token_archive(plan.tokens)
    then.append(["docker", "start", plan.name])
    env_names = list(docker_env(plan))
    return Command(docker_argv(plan), dict(client_env), env_names, tuple(then), stdin)


def bwrap_command(plan: RunPlan, python: HostPython) -> Command:
    env = bwrap_env(plan, python)
    fds = {fd: (plan.tokens[var] + "\n").encode() for var, fd in bwrap_token_fds(plan).items()}
    return Command(bwrap_argv(plan, python), env, sorted(env), fds=fds)


def bwrap_token_fds(plan: RunPlan) -> dict[str, int]:
    """The descriptor each token file's data arrives on in bwrap (3, 4, ...)."""
    return {var: 3 + i for i, var in enumerate(sorted(plan.tokens))}


# -- bwrap -----------------------------------------------------------------------------


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
    for path in [*package, *python.prefixes]:
        if not any(path.is_relative_to(b) for b in bound):
            argv += ["--ro-bind", str(path), str(path)]
            bound.append(path)
    for mount in home_mounts(plan):
        argv += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
    if plan.tokens:
        argv += ["--perms", "0700", "--dir", TOKEN_DIR]
    for var, fd in bwrap_token_fds(plan).items():
        argv += ["--perms", "0400", "--ro-bind-data", str(fd), f"{TOKEN_DIR}/{TOKEN_FILES[var]}"]
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
    env["PATH"] = f"{Path(python.executable).parent}:{SANDBOX_PATH_TAIL}"
    env.setdefault("TERM", "xterm-256color")
    env.setdefault("LANG", "C.UTF-8")
    if python.package_root is not None:
        env["PYTHONPATH"] = str(python.package_root)
    return env


def audit(mounts: Sequence[Mount], env_names: Sequence[str]) -> str:
    """The short human summary `--dry-run` prints on stderr: mounts and variable *names*."""
    lines = [f"mount {'rw' if m.writable else 'ro'} {m.source} -> {m.target}" for m in mounts]
    lines.append("env names: " + " ".join(sorted(env_names)))
    return "\n".join(lines)
