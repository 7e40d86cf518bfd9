"""Claude Code's hooks as the agent's state source: each launch gets a new hook secret, the
settings file that carries it and the session arguments that pin its conversation; the events
its hooks report are checked against that secret and applied to the agent's state.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from sidecar import claude_code
from sidecar.acting import Owner, acting
from sidecar.agent import AgentMachine
from sidecar.agent_files import AgentFiles
from sidecar.clis import CLIDef
from sidecar.config import Config
from sidecar.files import write_new


class HookSource:
    def __init__(
        self,
        config: Config,
        machine: AgentMachine,
        files: AgentFiles,
        on_idle: Callable[[], None],
    ) -> None:
        self.config = config
        self.machine = machine
        self.files = files
        self.on_idle = on_idle  # the agent went idle: an inbox notice may be due
        # Where the CLI's user reads it (the session dir with SIDECAR_USER), as that user's.
        self.settings_path = config.paths.claude_settings
        self._settings_owner = (
            Owner(config.user.uid, config.user.gid, act_as=True) if config.user else None
        )

    def launch(self, cli: CLIDef, env: Mapping[str, str], *, has_history: bool) -> tuple[str, ...]:
        """The argv to start Claude Code with (`env`: the CLI's environment): our hook settings
        and its pinned session. A new hook secret for every launch."""
        record = self.files.record
        pinned = record.session_id if record.session_cli == cli.name else None
        args, session = claude_code.session_args(
            pinned, claude_code.config_dir(env), self.config.workspace, has_history=has_history
        )
        secret = secrets.token_urlsafe(32)
        self.files.update(session_id=session, session_cli=cli.name, hook_secret=secret)
        self.machine.session_id = session
        base = claude_code.hook_base_url(self.config.host, self.config.port)
        document = claude_code.settings(base, secret, self.settings_path)
        # The file holds the secret: 0600, made as the CLI's user (with SIDECAR_USER; the
        # sidecar keeps the secret in memory and in its own state dir, never reads it back).
        with acting(self._settings_owner):
            write_new(self.settings_path, json.dumps(document, indent=1).encode(), 0o600)
        return (*cli.command, "--settings", str(self.settings_path), *args)

    def revoke(self) -> None:
        """Refuse hooks from here on (the CLI runs without hooks, or is being stopped)."""
        self.files.update(hook_secret=None)

    def secret_matches(self, given: str | None) -> bool:
        """Constant-time check of a hook call's secret against the running CLI's."""
        expected = self.files.record.hook_secret
        if given is None or expected is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())

    def hook(self, event: str, payload: dict[str, Any]) -> None:
        """A hook event from the running Claude Code (its secret was checked)."""
        effect = claude_code.interpret(event, payload)
        if effect.session_id is not None and effect.session_id != self.machine.session_id:
            # --continue picked a conversation: pin it from now on.
            self.machine.session_id = effect.session_id
            self.files.update(session_id=effect.session_id)
        if effect.state is None:
            return
        reason = effect.reason
        if (
            event == "Notification"
            and effect.state == "waiting"
            and self.machine.state == "waiting"
        ):
            reason = self.machine.status().reason  # the hook's own reason names the tool
        self.machine.report(effect.state, reason)
        if effect.state == "idle":
            self.on_idle()
