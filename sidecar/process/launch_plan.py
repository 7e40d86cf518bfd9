"""What one start of the CLI runs: the registry's argv for it, what the agent's awareness adds
(hook settings, a pinned session), the egress guard around it and the variables it gets; or why
it cannot start (an unknown CLI, a program not on PATH).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from sidecar.agent.awareness import Awareness
from sidecar.agent.registry import CLIDef
from sidecar.egress.service import no_proxy_with
from sidecar.security import loader_env
from sidecar.security.acting import Owner, acting, which

Argv = tuple[str, ...]
Address = tuple[str, int]


class LaunchPlan(NamedTuple):
    """One start of the CLI: the registry's argv it starts from (`command`), the argv the pane
    runs (our hook settings, session arguments and the egress guard added) and the variables it
    gets, or why it cannot start (`fatal`). `export`: the pane's waiter exports the variables
    (an open network), else the egress guard gives them to the CLI alone."""

    command: Argv
    argv: Argv
    env: dict[str, str]
    fatal: str | None
    export: bool = True


@dataclass
class LaunchPlanner:
    """`env`: the CLI's environment (its user's HOME with SIDECAR_USER), whose loader variables
    (`sidecar.security.loader_env`) reach the CLI with its own, never the processes around it;
    `owner`: how the sidecar acts in the workspace (sidecar.security.acting). The supervisor
    sets the egress parts once the proxy runs: its variables (they win) and the guard that wraps
    the CLI's argv (None: an open network), given the loopback address of the CLI's own server
    when it has one of ours (opencode's), which the CLI alone reaches around the proxy."""

    registry: Mapping[str, CLIDef]
    awareness: Awareness
    env: Mapping[str, str]
    owner: Owner | None
    workspace: Path
    egress_env: Mapping[str, str] = field(default_factory=dict)
    egress_guard: Callable[[Argv, Address | None], Argv] | None = None

    def plan(self, name: str, *, resume: bool) -> LaunchPlan:
        """What a start of the CLI `name` runs, or the reason it cannot start."""
        cli = self.registry.get(name)
        if cli is None:
            known = ", ".join(sorted(self.registry))
            fatal = (
                f"unknown CLI {name!r} (SLEEVE_CLI); known: {known}. "
                'POST /resleeve {"cli": NAME} starts one'
            )
            return LaunchPlan((), (), {}, fatal)
        with acting(self.owner):  # the history is the CLI user's, maybe private to it
            history = cli.has_history(self.env, self.workspace)
        command = cli.argv(resume=resume, has_history=history)
        # Not as the CLI's user: the launch keeps the hook secret in the sidecar's own state
        # file (each CLI's own files are made as the user who reads them, where they are made).
        argv, added = self.awareness.launch_argv(cli, command, self.env, has_history=history)
        env = {**loader_env.split(self.env)[1], **cli.env, **added, **self.egress_env}
        path = {**self.env, **env}.get("PATH", os.defpath)
        if which(argv[0], path, self.owner) is None:
            fatal = f"{argv[0]!r} not found on PATH ({path}); the {cli.name} CLI is not installed"
            return LaunchPlan(command, argv, env, fatal)
        if self.egress_guard is None:
            return LaunchPlan(command, argv, env, None)
        own = self.awareness.own_server
        if own is not None:
            env |= no_proxy_with(env, own)
        return LaunchPlan(command, self.egress_guard(argv, own), env, None, export=False)
