"""Claude Code's hooks: where it keeps its files (config dir, per-project transcripts), the
`--settings` document that makes its hooks report to the sidecar, the session arguments that pin
its conversation, and what each hook event means for the agent's state.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Hooks, Launched
from sidecar.core.contract import AgentStateName
from sidecar.core.text import one_line

# ---- on disk -----------------------------------------------------------------------------------

# Claude Code names a project's folder after its cwd, every character outside [A-Za-z0-9] a '-'.
_PROJECT_NAME = re.compile(r"[^A-Za-z0-9]")


def config_dir(env: Mapping[str, str]) -> Path:
    """Claude Code's config dir in the CLI's environment: CLAUDE_CONFIG_DIR, else ~/.claude."""
    if env.get("CLAUDE_CONFIG_DIR"):
        return Path(env["CLAUDE_CONFIG_DIR"])
    return Path(env.get("HOME", "/root")) / ".claude"


def project_dir(config: Path, workspace: Path) -> Path:
    """Where Claude Code keeps the conversations of `workspace` (projects/<encoded cwd>)."""
    return config / "projects" / _PROJECT_NAME.sub("-", str(workspace))


def transcript(config: Path, workspace: Path, session_id: str) -> Path:
    """The transcript of one conversation."""
    return project_dir(config, workspace) / f"{session_id}.jsonl"


def has_history(config: Path, workspace: Path) -> bool:
    """Whether Claude Code has a conversation for `workspace` (what `--continue` needs)."""
    try:
        return any(p.suffix == ".jsonl" for p in project_dir(config, workspace).iterdir())
    except OSError:
        return False


def history(env: Mapping[str, str], workspace: Path) -> bool:
    """Whether Claude Code, run with the environment `env`, has a conversation for `workspace`."""
    return has_history(config_dir(env), workspace)


# ---- hooks -------------------------------------------------------------------------------------
# Our `--settings` only add to the user's own settings files (Claude Code merges them), so their
# hooks keep working. Each event is POSTed to `/hooks/claude-code/<event>` on the sidecar's
# loopback port with a secret header; the secret is made anew for every launch (a hook from a
# CLI a resleeve stopped is refused) and kept in the state dir (`agent_files`), so a supervisor
# restart that adopts the running CLI still accepts it. SessionStart alone runs no HTTP hooks, so
# a command hook (`sidecar.agent.hook_relay`) relays it. Timings measured on Claude Code:
# docs/benchmarks.md.

HTTP_EVENTS = (
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "PermissionRequest",
    "PermissionDenied",
    "Notification",
    "Stop",
    "StopFailure",
    "SessionEnd",
)
# Only the calls the state needs: before a tool, only a question to the user says something new
# (the turn is already `working`); every other tool use costs the CLI an HTTP call for nothing.
QUESTION_TOOLS = frozenset({"AskUserQuestion"})
MATCHERS = {"PreToolUse": "|".join(sorted(QUESTION_TOOLS))}  # a regex of tool names
COMMAND_EVENTS = ("SessionStart",)  # 2.1.330: "HTTP hooks are not supported for SessionStart"
EVENTS = (*COMMAND_EVENTS, *HTTP_EVENTS)
# Seconds Claude Code waits for our answer. HTTP hooks cannot be asynchronous, so this bounds
# what a wedged sidecar costs each hook; a dead one refuses the connection at once.
HOOK_TIMEOUT = 2
RELAY_TIMEOUT = 5
# The PermissionRequest hook is held until the request is answered (`sidecar.agent.approvals`); the
# dialog is drawn while it is pending, and a person may answer it there first. Claude Code gives
# up on the hook after this many seconds and leaves the dialog to the person; the sidecar
# releases it a little earlier, after which an answer through the API is typed into the dialog.
PERMISSION_TIMEOUT = 600
MAX_HOLD = PERMISSION_TIMEOUT - 10
# Tools that ask the person something rather than act: the agent is waiting while they run.
DETAIL_KEYS = ("command", "file_path", "notebook_path", "path", "url", "pattern", "query")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def settings(base_url: str, secret: str, settings_path: Path) -> dict[str, Any]:
    """The `--settings` document: an HTTP hook per event, the relay for SessionStart."""
    headers = {SECRET_HEADER: secret}
    timeouts = {"PermissionRequest": PERMISSION_TIMEOUT}
    hooks: dict[str, Any] = {
        event: [
            {
                **({"matcher": MATCHERS[event]} if event in MATCHERS else {}),
                "hooks": [
                    {
                        "type": "http",
                        "url": base_url + event,
                        "headers": headers,
                        "timeout": timeouts.get(event, HOOK_TIMEOUT),
                    }
                ],
            }
        ]
        for event in HTTP_EVENTS
    }
    command = {"type": "command", "command": hook_relay.command(settings_path, "SessionStart")}
    hooks["SessionStart"] = [{"hooks": [{**command, "timeout": RELAY_TIMEOUT}]}]
    return {"hooks": hooks}


# ---- sessions --------------------------------------------------------------------------------


def new_session_id() -> str:
    return str(uuid.uuid4())


def session_args(
    session_id: str | None, config: Path, workspace: Path, *, has_history: bool
) -> tuple[tuple[str, ...], str | None]:
    """The session arguments and the session id they pin (None: learnt from SessionStart).

    The pinned id resumes its own conversation when Claude Code has it (`--resume`), and names
    a new one when it has not (`--session-id`: Claude Code writes nothing before the first
    prompt, and refuses `--resume` of an id it has no transcript for, or `--session-id` of one
    it has). Without an id (the state dir was lost: a new container), `--continue` takes the
    workspace's latest conversation when there is one."""
    if session_id is not None:
        if transcript(config, workspace, session_id).exists():
            return ("--resume", session_id), session_id
        return ("--session-id", session_id), session_id
    if has_history:
        return ("--continue",), None
    fresh = new_session_id()
    return ("--session-id", fresh), fresh


# ---- what an event means ---------------------------------------------------------------------


def _detail(tool_input: Any) -> str:
    if not isinstance(tool_input, dict):
        return ""
    for key in DETAIL_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return ""


def _question(tool_input: Any) -> str:
    questions = tool_input.get("questions") if isinstance(tool_input, dict) else None
    first = questions[0] if isinstance(questions, list) and questions else None
    text = first.get("question") if isinstance(first, dict) else None
    return text if isinstance(text, str) else ""


def interpret(event: str, payload: dict[str, Any]) -> HookEffect:
    """What a hook event says about the agent (pure: the caller applies it)."""
    raw_session = payload.get("session_id")
    session = raw_session if isinstance(raw_session, str) and UUID_RE.match(raw_session) else None
    tool = payload.get("tool_name")
    tool = tool if isinstance(tool, str) else "a tool"
    if event == "SessionStart":
        # A compaction mid-turn starts a "session" too; that one changes nothing.
        source = payload.get("source")
        state: AgentStateName | None = None if source == "compact" else "idle"
        return HookEffect(state, session_id=session)
    if event == "UserPromptSubmit":
        return HookEffect("working", session_id=session)
    if event == "PreToolUse" and tool in QUESTION_TOOLS:
        question = _question(payload.get("tool_input"))
        return HookEffect("waiting", one_line(f"question: {question}".strip(": ")))
    if event in ("PreToolUse", "PostToolUse", "PostToolUseFailure", "PermissionDenied"):
        return HookEffect("working")
    if event == "PermissionRequest":
        detail = _detail(payload.get("tool_input"))
        return HookEffect(
            "waiting", one_line(f"permission for {tool}{': ' + detail if detail else ''}")
        )
    if event == "Notification":
        kind = payload.get("notification_type")
        message = payload.get("message")
        text = one_line(message) if isinstance(message, str) else None
        if kind == "idle_prompt":
            return HookEffect("idle")
        if kind in ("permission_prompt", "elicitation_dialog"):
            return HookEffect("waiting", text, restates=True)
        return HookEffect(None)
    if event in ("Stop", "StopFailure"):
        reason = "the turn ended with an API error" if event == "StopFailure" else None
        return HookEffect("idle", reason)
    return HookEffect(None)  # SessionEnd: the process's exit is the supervisor's to report


def launch(start: HookLaunch) -> Launched:
    """Its command with our `--settings` and the session arguments that pin its conversation."""
    config = config_dir(start.env)
    args, session = session_args(
        start.session_id, config, start.workspace, has_history=start.has_history
    )
    document = settings(start.base_url, start.secret, start.settings_path)
    path = str(start.settings_path)
    return Launched((*start.command, "--settings", path, *args), document, session)


HOOKS = Hooks(
    EVENTS,
    launch,
    interpret,
    permission_event="PermissionRequest",
    max_hold=float(MAX_HOLD),
    remembers=True,  # Claude Code's own suggestions, for this session: none of the user's files
    reports_at_start=True,
    submit_event="UserPromptSubmit",
)
