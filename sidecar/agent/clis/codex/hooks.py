"""Codex CLI's hooks (0.169): the hooks the sidecar installs for the Codex it starts (`-c`
overrides on the argv, never the user's files), what each hook event means, and how a
conversation is resumed by id.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Hooks, Launched
from sidecar.core.contract import AgentStateName
from sidecar.core.text import one_line

# ---- on disk -----------------------------------------------------------------------------------


def codex_home(env: Mapping[str, str]) -> Path:
    """Codex's home in the CLI's environment: CODEX_HOME, else ~/.codex."""
    if env.get("CODEX_HOME"):
        return Path(env["CODEX_HOME"])
    return Path(env.get("HOME", "/root")) / ".codex"


def has_session(home: Path, session_id: str) -> bool:
    """Whether Codex keeps the conversation `session_id` (sessions/YYYY/MM/DD/rollout-*-<id>)."""
    try:
        return any((home / "sessions").rglob(f"rollout-*-{session_id}.jsonl"))
    except OSError:
        return False


# ---- hooks -------------------------------------------------------------------------------------
# Codex's hooks are commands (no HTTP hooks), so each event runs `sidecar.agent.hook_relay`, which
# POSTs it to `/hooks/codex/<event>` with the per-launch secret read from our settings file and
# prints the reply. They are added as `-c hooks.<Event>=[...]` overrides (the session-flags
# layer: Codex runs them beside the user's own hooks, which it loads from their own layers), so
# the argv carries the settings file's path, never the secret. Codex runs a hook only once it is
# trusted: the trust goes in the same layer (`-c hooks.state=...`), keyed by the hook's place
# and the hash of its definition, computed as Codex does (sha256 of its canonical JSON). A
# Codex that computes it otherwise shows its "Hooks need review" dialog: `waiting`, on screen.
# SessionStart runs when a conversation starts (the first prompt, or a resume), not at launch.

EVENTS = (
    "SessionStart",
    "UserPromptSubmit",
    "PermissionRequest",
    "PostToolUse",
    "Stop",
    "Interrupt",
)
HOOK_TIMEOUT = 3  # seconds Codex waits for a hook (at most 3 for Interrupt); the relay: 1
# The PermissionRequest hook is held until the request is answered. Codex draws its own
# approval dialog only once the hook returned no decision: until then its screen shows the turn
# at work ("Running hook"). The sidecar releases the hook unanswered a little before Codex's own
# timeout, and the dialog appears for a person.
PERMISSION_TIMEOUT = 600
MAX_HOLD = PERMISSION_TIMEOUT - 10
_SESSION_LAYER = "/<session-flags>/config.toml"  # where Codex files hooks from `-c`
_SNAKE = re.compile(r"(?<!^)(?=[A-Z])")


def _timeout(event: str) -> int:
    return PERMISSION_TIMEOUT if event == "PermissionRequest" else HOOK_TIMEOUT


def settings(base_url: str, secret: str) -> dict[str, Any]:
    """Our settings file, read by the relay only: an HTTP hook per event (URL, secret, timeout)."""
    return {
        "hooks": {
            event: [
                {
                    "hooks": [
                        {
                            "type": "http",
                            "url": base_url + event,
                            "headers": {SECRET_HEADER: secret},
                            "timeout": _timeout(event),
                        }
                    ]
                }
            ]
            for event in EVENTS
        }
    }


def trust_hash(event: str, handler: Mapping[str, Any]) -> str:
    """The hash Codex trusts a command hook by: its normalized definition as canonical JSON."""
    identity = {"event_name": _SNAKE.sub("_", event).lower(), "hooks": [handler]}
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def toml(value: Any) -> str:
    """`value` as a TOML inline value (a `-c` override's value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string takes JSON's escapes
    if isinstance(value, list):
        return "[" + ",".join(toml(v) for v in value) + "]"
    return "{" + ",".join(f"{json.dumps(str(k))}={toml(v)}" for k, v in value.items()) + "}"


def overrides(settings_path: Path) -> tuple[str, ...]:
    """The `-c` arguments that install our hooks, trusted, for this launch."""
    args: list[str] = []
    state: dict[str, Any] = {}
    for event in EVENTS:
        handler = {
            "type": "command",
            "command": hook_relay.command(settings_path, event),
            "timeout": _timeout(event),
            "async": False,
        }
        args += ["-c", f"hooks.{event}={toml([{'hooks': [handler]}])}"]
        key = f"{_SESSION_LAYER}:{_SNAKE.sub('_', event).lower()}:0:0"
        state[key] = {"trusted_hash": trust_hash(event, handler)}
    return (*args, "-c", f"hooks.state={toml(state)}")


# ---- what an event means ---------------------------------------------------------------------


def interpret(event: str, payload: dict[str, Any]) -> HookEffect:
    """What a hook event says about the agent (pure: the caller applies it)."""
    raw = payload.get("session_id")
    session = raw if isinstance(raw, str) and raw.strip() else None
    if event == "SessionStart":
        return HookEffect(None, session_id=session)  # the prompt that started it says more
    if event in ("UserPromptSubmit", "PostToolUse"):
        return HookEffect("working", session_id=session)
    if event == "PermissionRequest":
        tool = payload.get("tool_name")
        tool = tool if isinstance(tool, str) else "a tool"
        tool_input = payload.get("tool_input")
        command = tool_input.get("command") if isinstance(tool_input, dict) else None
        detail = f": {command}" if isinstance(command, str) and command.strip() else ""
        state: AgentStateName = "waiting"
        return HookEffect(state, one_line(f"permission for {tool}{detail}"), session)
    if event in ("Stop", "Interrupt"):
        return HookEffect("idle", session_id=session)
    return HookEffect(None)


def launch(start: HookLaunch) -> Launched:
    """Our hooks, no shared background server (it would outlive the CLI and run hooks from
    another launch's config), and the pinned conversation resumed when Codex has it; else the
    registry's argv, the conversation learnt from SessionStart."""
    ours = (*overrides(start.settings_path), "--no-daemon")
    pinned = start.session_id
    if pinned is not None and has_session(codex_home(start.env), pinned):
        argv = (*start.command, "resume", pinned, *ours)
    else:
        argv, pinned = (*start.argv, *ours), None
    return Launched(argv, settings(start.base_url, start.secret), pinned)


# Codex's hook takes no "remember" (it fails closed on `updatedPermissions`): an allow is for
# that request only.
HOOKS = Hooks(
    EVENTS,
    launch,
    interpret,
    permission_event="PermissionRequest",
    max_hold=float(MAX_HOLD),
    submit_event="UserPromptSubmit",
)
