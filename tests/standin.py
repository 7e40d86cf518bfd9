"""A sidecar whose agent waits on a permission prompt, without the real Claude Code: a stand-in
`claude` (state source `hooks`) that draws a permission prompt, and the PermissionRequest hook
Claude Code would send, with the secret the sidecar handed it in its hook settings file.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import Reply, Sidecar, http, wait_for, write_cli_config
from tests.proctools import pane_text, tmux


class HeldHook:
    """A PermissionRequest hook call as Claude Code makes it, with the secret from the sidecar's
    hook settings file, made from a thread: the sidecar holds it until the request is answered,
    and `reply` is then what Claude Code would be told."""

    def __init__(self, sc: Sidecar, payload: dict[str, Any]) -> None:
        settings = json.loads((sc.state_dir / "claude-code-hooks.json").read_text())
        hook = settings["hooks"]["PermissionRequest"][0]["hooks"][0]
        self.reply: Reply | None = None

        def call() -> None:
            with contextlib.suppress(OSError):  # the sidecar stopped while it held the call
                self.reply = http(
                    "POST", hook["url"], payload, headers=hook["headers"], timeout=600
                )

        self.thread = threading.Thread(target=call, daemon=True)
        self.thread.start()


def waiting_sidecar(
    make_sidecar: Callable[..., Sidecar], tmp: Path, command: str, **env: str
) -> Sidecar:
    """Started, its agent `waiting` for permission to run the Bash `command`: the request
    listed, then its dialog drawn.

    The stand-in draws its dialog only once the hook's request is listed (it waits for a line
    typed into the pane). Drawn first, the screen alone would say `waiting`, and with no
    request listed yet the notifier tells of the dialog too: a second notification, whenever
    the hook's thread comes late (a dwell of 0 s gives it no time)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "claude"  # `state: hooks` is for Claude Code's command only
    standin.write_text(
        f"#!{sys.executable}\nimport signal\nimport sys\n"
        "sys.stdin.readline()\n"
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
    # Held: no reply yet. Kept on the sidecar for tests that look at the reply.
    sc.held_hook = HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": command}})
    wait_for(lambda: sc.get("/approvals").body["approvals"], 10, what="the request listed")
    tmux(sc, "send-keys", "-t", "main", "Enter")
    wait_for(lambda: "Do you want to proceed?" in pane_text(sc), 10, what="the dialog drawn")
    sc.wait_status(lambda s: s["agent"]["state"] == "waiting", "agent waiting")
    return sc
