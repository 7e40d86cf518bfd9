"""argv builders for the two runtimes (docker, bwrap) and the mount/env plan they share.

`sleeve run` executes exactly the list built here and `--dry-run` prints that same list, so the
two cannot drift. The builders are pure but for a look at the host's layout (/bin symlinks,
where Python lives). Secrets never enter an argv: variables copied from the host go by name
(docker `-e NAME`) or through the process environment (bwrap), never `NAME=value` on a line.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_HOME = "/home/sleeve"
WORKSPACE = "/workspace"
STATE_DIR = "/run/sidecar"
CONTAINER_PORT = 8080  # the sidecar's default; docker publishes it on 127.0.0.1:<port>
CONTAINER_TTYD_PORT = 7681
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
# Host-side launcher settings that mean nothing inside a sleeve.
HOST_ONLY = frozenset({"SLEEVE_HOME"})


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
    ttyd_port: int
    image: str = "sleeve:latest"
    network_host: bool = False
    passthrough: Mapping[str, str] = field(default_factory=dict)


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


def fixed_env(plan: RunPlan, *, port: int, ttyd_port: int, host: str) -> dict[str, str]:
    """The variables the launcher chooses; they win over anything passed through."""
    env = {
        "HOME": SANDBOX_HOME,
        "SLEEVE_NAME": plan.slot_id,
        "SLEEVE_CLI": plan.cli,
        "SIDECAR_HOST": host,
        "SIDECAR_PORT": str(port),
        "TTYD_PORT": str(ttyd_port),
        "SIDECAR_WORKSPACE": WORKSPACE,
        "SIDECAR_STATE_DIR": STATE_DIR,
    }
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
        "sleeve.home": plan.home_label,
        "sleeve.project": plan.project_key,
        "sleeve.slot": str(plan.slot_index),
        "sleeve.slot-id": plan.slot_id,
        "sleeve.cli": plan.cli,
        "sleeve.port": str(plan.port),
    }


def docker_env(plan: RunPlan) -> dict[str, str | None]:
    """The container's variables; None means `--env NAME`: docker copies the client's value."""
    if plan.network_host:
        fixed = fixed_env(plan, port=plan.port, ttyd_port=plan.ttyd_port, host="127.0.0.1")
    else:  # all interfaces of the container's own network; published on 127.0.0.1 only
        fixed = fixed_env(plan, port=CONTAINER_PORT, ttyd_port=CONTAINER_TTYD_PORT, host="0.0.0.0")  # noqa: S104
    env: dict[str, str | None] = {k: None for k in sorted(plan.passthrough) if k not in fixed}
    env.update(fixed)
    return env


def docker_argv(plan: RunPlan) -> list[str]:
    """`docker run -d ...` for the sidecar image; no --privileged, API on 127.0.0.1 only."""
    argv = ["docker", "run", "--detach", "--name", plan.name]
    for key, value in docker_labels(plan).items():
        argv += ["--label", f"{key}={value}"]
    if plan.network_host:
        argv += ["--network", "host"]
    else:
        argv += ["--publish", f"127.0.0.1:{plan.port}:{CONTAINER_PORT}"]
    for mount in home_mounts(plan):
        argv += ["--mount", _mount_flag(mount)]
    for name, setting in docker_env(plan).items():
        argv += ["--env", name if setting is None else f"{name}={setting}"]
    argv += ["--workdir", WORKSPACE, plan.image]
    return argv


@dataclass(frozen=True)
class Command:
    """An argv, the environment it is executed with, and the variable names the sleeve sees."""

    argv: list[str]
    env: dict[str, str]
    env_names: list[str]


def docker_command(plan: RunPlan, client_env: Mapping[str, str]) -> Command:
    return Command(docker_argv(plan), dict(client_env), list(docker_env(plan)))


def bwrap_command(plan: RunPlan, python: HostPython) -> Command:
    env = bwrap_env(plan, python)
    return Command(bwrap_argv(plan, python), env, sorted(env))


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
    argv += ["--chdir", WORKSPACE, "--", python.executable, "-m", "sidecar", "run"]
    return argv


def bwrap_env(plan: RunPlan, python: HostPython) -> dict[str, str]:
    """The sandbox's whole environment; bwrap is started with exactly this (see module doc).

    bwrap's `--clearenv --setenv NAME VALUE` would put API keys into argv, which every user
    can read in /proc/PID/cmdline; handing bwrap a clean environment has the same effect.
    """
    env = dict(plan.passthrough)
    env.update(fixed_env(plan, port=plan.port, ttyd_port=plan.ttyd_port, host="127.0.0.1"))
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
