"""The plan of one sleeve, built once and rendered by each runtime: mounts, variables, tokens.

`sleeve run` executes exactly the lists the runtimes build from it and `--dry-run` prints
those same lists, so the two cannot drift; `sleeve manifest` renders the same plan for a
cluster. Secrets never enter an argv: host variables go by name or through the process
environment, and the sleeve's API tokens go in as files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.core.contract import (
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_WORKSPACE,
    runtime_grace,
)
from sidecar.launcher import homes
from sidecar.launcher.fsutil import LauncherError
from sidecar.security.tokens import TOKEN_VAR, TOKEN_VARS, VIEW_TOKEN_VAR

if TYPE_CHECKING:  # `--secret` is parsed by the commands that take it (`sleeve slots` does not)
    from sidecar.launcher.secretopts import SecretArg

SANDBOX_HOME = "/home/sleeve"
# Inside a sleeve the sidecar keeps the contract's defaults; docker publishes the port on
# 127.0.0.1:<port>.
WORKSPACE = DEFAULT_WORKSPACE
STATE_DIR = DEFAULT_STATE_DIR
CONTAINER_PORT = DEFAULT_PORT
#: Inside a sleeve: the API token files (root's, 0700, in the container).
TOKEN_DIR = "/run/sleeve"  # noqa: S105 - a path, not a password
TOKEN_FILES = {TOKEN_VAR: "token", VIEW_TOKEN_VAR: "view-token"}
#: Inside a sleeve, beside the token files: SIDECAR_SECRETS_FILE (`--secret`), and (docker)
#: the folder of the values' files.
SECRETS_FILE = f"{TOKEN_DIR}/secrets.yaml"
SECRETS_DIR = f"{TOKEN_DIR}/secrets"
#: The variable of the sidecar's own environment a secret's value travels in (from_env).
FROM_ENV_PREFIX = "SLEEVE_SECRET_"
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
# The sleeve's API tokens, by value or by file: the launcher hands them in as files of its own.
TOKEN_SETTINGS = frozenset(name for var in TOKEN_VARS for name in (var, f"{var}_FILE"))
# Host-side launcher settings that mean nothing inside a sleeve, and what the launcher decides
# itself (the tokens; the CLI's user is the invoking one).
# The egress allowlist is `--egress`'s to set (a host variable would come beside it: exit 2).
EGRESS_SETTINGS = frozenset({"SIDECAR_EGRESS_ALLOW", "SIDECAR_EGRESS_ALLOW_FILE"})
HOST_ONLY = frozenset(
    {
        "SLEEVE_HOME",
        *TOKEN_SETTINGS,
        *EGRESS_SETTINGS,
        "SIDECAR_USER",
        "SIDECAR_USER_HOME",
        "SIDECAR_SECRETS_FILE",  # `--secret`'s to write
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
    # The egress allowlist's patterns (`--egress`); None: the network is open.
    egress: tuple[str, ...] | None = None
    # SLEEVE_NAME (the sleeve's name in its /status and dashboard); None: the slot's id.
    sleeve_name: str | None = None
    # `--secret`s, their values read (never printed: SecretArg keeps them out of its repr).
    secrets: tuple[SecretArg, ...] = ()

    @property
    def stop_timeout(self) -> int:
        """Seconds the runtime gives this sleeve between SIGTERM and SIGKILL: the stop-grace
        rule (`contract.runtime_grace`) for the SIDECAR_STOP_GRACE it passes in. LauncherError
        for a value the sidecar would refuse."""
        from sidecar import config  # here, not at the top: `sleeve slots` does without it

        try:
            return runtime_grace(config.stop_grace(self.passthrough))
        except config.ConfigError as exc:
            raise LauncherError(str(exc)) from None


def home_mounts(plan: RunPlan) -> list[Mount]:
    """The shared mount plan, in order: later mounts sit on top of earlier ones.

    The workspace, then what the slot keeps of each CLI (`sidecar.launcher.homes`): its config
    dir read-write (an OAuth refresh rewrites the sign-in), and the instance's per-project paths
    over it, so history belongs to the project and survives a hard resleeve.
    """
    return [
        Mount(plan.workspace, WORKSPACE),
        *(
            Mount(source, f"{SANDBOX_HOME}/{path}")
            for source, path in homes.mounts(plan.slot_dir, plan.instance_dir)
        ),
    ]


def passthrough_env(
    host_env: Mapping[str, str], secrets: Sequence[SecretArg] = ()
) -> dict[str, str]:
    """The allow-listed host variables a sleeve may see; never a variable a `--secret` sets
    (the sleeve gets its placeholder, not the host's real value) nor one named like a secret's
    carrier (SLEEVE_SECRET_*)."""
    taken = {s.env for s in secrets}
    return {
        k: v
        for k, v in host_env.items()
        if k not in HOST_ONLY
        and k not in taken
        and not k.startswith(FROM_ENV_PREFIX)
        and (k in PASSTHROUGH or k.startswith(PASSTHROUGH_PREFIXES))
    }


def fixed_env(plan: RunPlan, *, port: int, host: str) -> dict[str, str]:
    """The variables the launcher chooses; they win over anything passed through. (TTYD_PORT
    stays unset: ttyd listens on a unix socket only the sidecar reaches.)"""
    env = {
        "HOME": SANDBOX_HOME,
        "SLEEVE_NAME": plan.sleeve_name or plan.slot_id,
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
    if plan.egress is not None:
        env["SIDECAR_EGRESS_ALLOW"] = ",".join(plan.egress) or "none"
    if plan.secrets:
        from sidecar.launcher.secretopts import git_env

        env["SIDECAR_SECRETS_FILE"] = SECRETS_FILE
        env.update(git_env(plan.secrets))
    return env


def token_files(plan: RunPlan) -> dict[str, bytes]:
    """The files the sleeve reads its API tokens from, by name in TOKEN_DIR."""
    return {TOKEN_FILES[var]: (plan.tokens[var] + "\n").encode() for var in sorted(plan.tokens)}


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


def audit(mounts: Sequence[Mount], env_names: Sequence[str]) -> str:
    """The short human summary `--dry-run` prints on stderr: mounts and variable *names*."""
    lines = [f"mount {'rw' if m.writable else 'ro'} {m.source} -> {m.target}" for m in mounts]
    lines.append("env names: " + " ".join(sorted(env_names)))
    return "\n".join(lines)
