"""A sidecar whose agent waits on a permission prompt, without the real Claude Code: a stand-in
`claude` (state source `hooks`) that draws a permission prompt, and the PermissionRequest hook
Claude Code would send, with the secret the sidecar handed it in its hook settings file. The
sidecar holds that hook until the request is answered, so it is sent from a thread, as the CLI
would wait on it; its reply is kept.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import Reply, Sidecar, http, write_cli_config


class HeldHook:
    """The PermissionRequest hook call, waiting for the sidecar's reply in a thread."""

    def __init__(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> None:
        self.reply: Reply | None = None
        self.error: Exception | None = None
        args = ("POST", url, payload)
        self.thread = threading.Thread(
            target=self._call, args=(args, headers), daemon=True, name="held-hook"
        )
        self.thread.start()

    def _call(self, args: tuple[str, str, dict[str, Any]], headers: dict[str, str]) -> None:
        try:
            self.reply = http(*args, headers=headers, timeout=600)
        except Exception as exc:  # kept for the test to look at
            self.error = exc


def waiting_sidecar(
    make_sidecar: Callable[..., Sidecar], tmp: Path, command: str, **env: str
) -> Sidecar:
    """Started, its agent `waiting` for permission to run the Bash `command`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "claude"  # `state: hooks` is for Claude Code's command only
    standin.write_text(
        f"#!{sys.executable}\nimport signal\n"
        f"print({('Bash command: ' + command)!r})\n"
        "print('Do you want to proceed?')\nprint('> 1. Yes')\nprint('  2. No')\n"
        "signal.pause()\n"
    )
    standin.chmod(0o755)
    config = write_cli_config(
        tmp / "clis.yaml", {"standin": {"command": [str(standin)], "state": "hooks"}}
    )
    sc = make_sidecar(cli="standin", env_extra={"SIDECAR_CLI_CONFIG": str(config), **env})
    sc.start()
    settings = json.loads((sc.state_dir / "claude-code-hooks.json").read_text())
    hook = settings["hooks"]["PermissionRequest"][0]["hooks"][0]
    payload = {"tool_name": "Bash", "tool_input": {"command": command}}
    sc.held_hook = HeldHook(hook["url"], payload, hook["headers"])
    sc.wait_status(lambda s: s["agent"]["state"] == "waiting", "agent waiting")
    return sc
