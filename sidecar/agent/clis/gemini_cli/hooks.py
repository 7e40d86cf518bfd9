"""Gemini CLI's hooks (0.61): the system-defaults settings file of ours that makes its command
hooks report to the sidecar, the session arguments that pin its conversation, and what each hook
event means for the agent's state.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Hooks, Launched
from sidecar.core.text import one_line

# Gemini CLI reads settings at four levels, and concatenates every level's hooks. The lowest, the
# system defaults, is named by an environment variable: that file is ours (the user's own
# settings files are never written; an administrator's system defaults are copied into ours).
# Gemini reads a system file only when it and every directory above it belong to root and are
# not writable by group or others; anything else it skips with a warning, and our hooks with it
# (the hook source then falls back to the screen and pane activity). It runs the hooks of the
# settings only in a trusted folder. Its hooks are shell commands (JSON on stdin, JSON on
# stdout): `sidecar.agent.hook_relay` posts each event to `/hooks/gemini-cli/<event>`. They are
# awaited, the ToolPermission notification before the confirmation is drawn; none of them can
# allow a tool the policy asks about (BeforeTool can only deny or force the question), so a
# confirmation is answered by keys (its package's `screen`).
SYSTEM_DEFAULTS_ENV = "GEMINI_CLI_SYSTEM_DEFAULTS_PATH"
SYSTEM_SETTINGS_ENV = "GEMINI_CLI_SYSTEM_SETTINGS_PATH"
SYSTEM_SETTINGS = Path("/etc/gemini-cli/settings.json")
# Only the calls the state needs: each hook is a process the CLI waits for.
EVENTS = ("SessionStart", "BeforeAgent", "Notification", "AfterTool", "AfterAgent", "SessionEnd")
HOOK_TIMEOUT_MS = 5000  # the relay itself gives up after a second
HOOK_NAME = "sidecar"  # how Gemini shows our hooks while they run
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# Gemini CLI runs headless (no terminal UI: a prompt from stdin, then exit) when one of these is
# exactly "true", as CI services set them. The sidecar runs it in a terminal for a person, so it
# gets "1" instead: Gemini's own test no longer matches, and the tools it runs still read "in CI"
# (ci-info, is-in-ci and std-env take any value but "false" and "0" for it).
HEADLESS_MARKERS = ("CI", "GITHUB_ACTIONS")


def interactive_env(env: Mapping[str, str]) -> dict[str, str]:
    """The values that keep Gemini CLI interactive in the CLI's environment `env`."""
    return {name: "1" for name in HEADLESS_MARKERS if env.get(name) == "true"}


def gemini_dir(env: Mapping[str, str]) -> Path:
    """Gemini CLI's own dir in the CLI's environment: $GEMINI_CLI_HOME/.gemini, else ~/.gemini."""
    return Path(env.get("GEMINI_CLI_HOME") or env.get("HOME", "/root")) / ".gemini"


def system_defaults(env: Mapping[str, str]) -> Path:
    """The system defaults file the CLI would read without ours."""
    if env.get(SYSTEM_DEFAULTS_ENV):
        return Path(env[SYSTEM_DEFAULTS_ENV])
    system = Path(env[SYSTEM_SETTINGS_ENV]) if env.get(SYSTEM_SETTINGS_ENV) else SYSTEM_SETTINGS
    return system.parent / "system-defaults.json"


def _read_object(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def settings(
    base_url: str, secret: str, settings_path: Path, inherited: Mapping[str, Any]
) -> dict[str, Any]:
    """Our system defaults: `inherited` (the administrator's) with a relay hook added per event,
    and the hook route (URL and secret) the relay reads."""
    document = dict(inherited)
    hooks = dict(document.get("hooks") or {})
    for event in EVENTS:
        ours = {
            "type": "command",
            "name": HOOK_NAME,
            "command": hook_relay.command(settings_path, event),
            "timeout": HOOK_TIMEOUT_MS,
        }
        hooks[event] = [*(hooks.get(event) or []), {"hooks": [ours]}]
    document["hooks"] = hooks
    document["sidecar"] = {"url": base_url, "headers": {SECRET_HEADER: secret}}
    return document


# ---- sessions --------------------------------------------------------------------------------


def _chats(gemini: Path, workspace: Path) -> Path | None:
    """Where Gemini CLI keeps the workspace's conversations (tmp/<its name>/chats)."""
    projects = _read_object(gemini / "projects.json").get("projects")
    name = projects.get(str(workspace)) if isinstance(projects, dict) else None
    return gemini / "tmp" / name / "chats" if isinstance(name, str) and name else None


def _sessions(chats: Path | None) -> list[Path]:
    try:
        return [p for p in chats.iterdir() if p.name.startswith("session-")] if chats else []
    except OSError:
        return []


CONTEXT = "<session_context>"  # the first user message Gemini sets up itself


def _counts(message: Any) -> bool:
    """A message Gemini resumes a conversation for: a reply, or a prompt of the user's."""
    if not isinstance(message, dict) or message.get("type") not in ("user", "gemini"):
        return False
    content = message.get("content")
    first = content[0] if isinstance(content, list) and content else content
    text = first.get("text") if isinstance(first, dict) else first
    return not (isinstance(text, str) and text.startswith(CONTEXT))


def _resumable(path: Path) -> bool:
    """Whether Gemini would resume a conversation file: read as Gemini reads it (a header line
    starts it over, a "$set" of messages replaces them, other records are appended), it holds a
    prompt or a reply."""
    resumable = False
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                update = record.get("$set")
                if isinstance(update, dict) and isinstance(update.get("messages"), list):
                    resumable = any(_counts(m) for m in update["messages"])
                elif "sessionId" in record and "type" not in record:
                    resumable = False
                elif _counts(record):
                    resumable = True
    except OSError:
        return False
    return resumable


def session_files(gemini: Path, workspace: Path, session_id: str) -> list[Path]:
    """The files of conversation `session_id` in `workspace` (each named after the id's first 8
    characters, its first line holding the whole id; a resume may start another one)."""
    found = []
    for path in _sessions(_chats(gemini, workspace)):
        if path.stem.endswith(f"-{session_id[:8]}"):
            try:
                with path.open(encoding="utf-8") as fh:
                    if session_id in fh.readline():
                        found.append(path)
            except OSError:
                continue
    return found


def session_args(
    session_id: str | None, gemini: Path, workspace: Path
) -> tuple[tuple[str, ...], str | None]:
    """The session arguments and the session id they pin (None: learnt from SessionStart). The
    pinned id is resumed when Gemini has it (`--resume <id>`) and names a new conversation when
    it has not (`--session-id`). Gemini writes a conversation's file at its start but resumes it
    only once it holds a prompt, and refuses `--session-id` for any id it has a file for: such an
    id is replaced by a new one (so is one that 0.61 lost itself: resumed within the minute its
    file is named after, it starts the conversation over in that same file). Without an id (the
    state dir was lost), `--resume latest` takes the workspace's latest conversation, if any."""
    if session_id is not None:
        files = session_files(gemini, workspace, session_id)
        if not files:
            return ("--session-id", session_id), session_id
        if any(_resumable(p) for p in files):
            return ("--resume", session_id), session_id
    elif any(_resumable(p) for p in _sessions(_chats(gemini, workspace))):
        return ("--resume", "latest"), None
    fresh = str(uuid.uuid4())
    return ("--session-id", fresh), fresh


# ---- what an event means ---------------------------------------------------------------------


def permission_reason(details: Any, message: Any) -> str:
    """'<tool>: <what>' of a ToolPermission notification's details, as its confirmation heads
    it ("Shell: touch x")."""
    if isinstance(details, dict):
        kind = details.get("type")
        what = {
            "exec": ("Shell", details.get("command")),
            "edit": ("Edit", details.get("filePath") or details.get("fileName")),
            "mcp": (details.get("serverName") or "MCP", details.get("toolName")),
            "info": ("Fetch", " ".join(u for u in details.get("urls") or [] if isinstance(u, str))),
        }.get(kind if isinstance(kind, str) else "")
        if what is not None and isinstance(what[1], str) and what[1].strip():
            return one_line(f"{what[0]}: {what[1]}")
        title = details.get("title")
        if isinstance(title, str) and title.strip():
            return one_line(title)
    return one_line(message) if isinstance(message, str) and message.strip() else "a tool"


def interpret(event: str, payload: dict[str, Any]) -> HookEffect:
    """What a hook event says about the agent (pure: the caller applies it)."""
    raw = payload.get("session_id")
    session = raw if isinstance(raw, str) and UUID_RE.match(raw) else None
    if event == "SessionStart":
        # Before its input takes keys: what a typed Enter does then is left to chance (a
        # newline, not a submission). The screen says `idle` once the prompt is drawn.
        return HookEffect(None, session_id=session)
    if event == "BeforeAgent":
        return HookEffect("working", session_id=session)
    if event == "AfterTool":
        return HookEffect("working")
    if event == "Notification" and payload.get("notification_type") == "ToolPermission":
        reason = permission_reason(payload.get("details"), payload.get("message"))
        return HookEffect("waiting", reason, restates=True)
    if event == "AfterAgent":
        return HookEffect("idle")
    return HookEffect(None)  # SessionEnd: the process's exit is the supervisor's to report


def launch(start: HookLaunch) -> Launched:
    """Its command with our system defaults (theirs copied in) and the session arguments that pin
    its conversation, kept interactive (`interactive_env`)."""
    inherited = system_defaults(start.env)
    document = settings(
        start.base_url,
        start.secret,
        start.settings_path,
        _read_object(inherited) if inherited != start.settings_path else {},
    )
    args, session = session_args(start.session_id, gemini_dir(start.env), start.workspace)
    env = {**interactive_env(start.env), SYSTEM_DEFAULTS_ENV: str(start.settings_path)}
    return Launched((*start.command, *args), document, session, env)


# Hooks that report, no decision channel: nothing is held (no hook of Gemini's can answer a
# confirmation). Our settings are a system file: root's, in root's directories.
HOOKS = Hooks(
    EVENTS, launch, interpret, root_settings=True, reports_at_start=True, submit_event="BeforeAgent"
)
