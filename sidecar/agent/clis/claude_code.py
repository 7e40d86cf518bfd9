"""What the sidecar knows about Claude Code: where it keeps its files (config dir, per-project
transcripts), the `--settings` document that makes its hooks report to the sidecar, the session
arguments that pin its conversation, and what each hook event means for the agent's state.
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.agent import hook_relay
from sidecar.agent.approvals import Answer
from sidecar.agent.hooks import SECRET_HEADER, HookEffect, HookLaunch, Launched, PermissionAsk
from sidecar.agent.screens import Reading, Seen, dialog, nonblank, text_of
from sidecar.core.contract import AgentStateName, InputKey
from sidecar.core.text import one_line
from sidecar.pane.screen import Screen

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
            return HookEffect("waiting", text)
        return HookEffect(None)
    if event in ("Stop", "StopFailure"):
        reason = "the turn ended with an API error" if event == "StopFailure" else None
        return HookEffect("idle", reason)
    return HookEffect(None)  # SessionEnd: the process's exit is the supervisor's to report


def permission(event: str, payload: dict[str, Any]) -> PermissionAsk | None:
    """A PermissionRequest to hold until it is answered."""
    if event != "PermissionRequest":
        return None
    tool = payload.get("tool_name")
    return PermissionAsk(tool if isinstance(tool, str) else "tool", payload.get("tool_input"))


def permission_answer(answer: Answer, payload: dict[str, Any]) -> dict[str, Any]:
    """The held PermissionRequest hook's reply. `remember` takes Claude Code's own suggestions
    ("don't ask again for ...") for this session only: nothing is written to the user's files."""
    decision: dict[str, Any] = {"behavior": answer.decision}
    if answer.decision == "deny" and answer.message:
        decision["message"] = answer.message
    suggestions = payload.get("permission_suggestions")
    if answer.decision == "allow" and answer.remember and isinstance(suggestions, list):
        decision["updatedPermissions"] = [
            {**s, "destination": "session"} for s in suggestions if isinstance(s, dict)
        ]
    return {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}


def approval_keys(decision: str, remember: bool) -> tuple[InputKey, ...]:
    """Keys that answer its permission dialog ("1. Yes" is selected; "2. Yes, and don't ask
    again ..."; Escape is "No" and tells Claude to wait for the person's instructions)."""
    if decision == "deny":
        return ("Escape",)
    return ("Down", "Enter") if remember else ("Enter",)


class ClaudeHooks:
    """Claude Code as a `sidecar.agent.hooks.HookCLI`."""

    name = "claude-code"
    events: tuple[str, ...] = EVENTS
    max_hold = float(MAX_HOLD)
    decides = True
    reports_at_start = True
    root_settings = False

    def launch(self, launch: HookLaunch) -> Launched:
        config = config_dir(launch.env)
        args, session = session_args(
            launch.session_id, config, launch.workspace, has_history=launch.has_history
        )
        document = settings(launch.base_url, launch.secret, launch.settings_path)
        return Launched(
            (*launch.cli.command, "--settings", str(launch.settings_path), *args),
            document,
            session,
        )

    def interpret(self, event: str, payload: dict[str, Any]) -> HookEffect:
        return interpret(event, payload)

    def permission(self, event: str, payload: dict[str, Any]) -> PermissionAsk | None:
        return permission(event, payload)

    def answer(self, answer: Answer, payload: dict[str, Any]) -> dict[str, Any]:
        return permission_answer(answer, payload)


# ---- what its screen shows (2.1.330, captured in tests/screens/claude-code/) ----------------

# The input box: a full-width rule, the "❯" line(s) of the prompt, another rule; its footer says
# "esc to interrupt" while a turn runs, above it a spinner line. A permission prompt asks "Do
# you want to ..." (proceed, make this edit, create, fetch) over numbered choices; its title
# (e.g. "Bash command") stands just below the rule that opens it. Anything else is a dialog
# (trust, sign-in, pickers, MCP).
_RULE = re.compile(r"^\s*─{20,}\s*$")
_INPUT = re.compile(r"^\s*[❯>](\s|$)")
_BUSY = re.compile(r"esc to interrupt", re.IGNORECASE)
# The spinner's line while a turn runs: "✢ Kerfuffling… (0s · ↓ 20 tokens)". It is there before
# the footer's "esc to interrupt" when an answered permission prompt gives way (measured); while a
# hook runs it reads "(running PermissionRequest hook · 0s · ...)".
_SPINNER = re.compile(r"^\s*\S\s+\S[^…]*…\s+\((\d|running )")
_ASKS = re.compile(r"^\s*Do you want to\b.*\?\s*$")
_DASHED = re.compile(r"^\s*╌{10,}\s*$")


# The last line of a whole frame: a dialog's key hints, or the idle prompt's hint line.
_DIALOG_FOOTER = re.compile(r"^\s*(Enter to (confirm|select|continue)|Esc to (cancel|go back))")
_IDLE_HINT = re.compile(r"\? for shortcuts")


def read_screen(screen: Screen) -> Reading:
    """What Claude Code's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    tail = nonblank(lines)[-4:]
    footed = any(_DIALOG_FOOTER.match(line) for line in tail)
    asks = [i for i, line in enumerate(lines) if _ASKS.match(line)]
    if asks:
        return Reading(Seen.PERMISSION, _permission_reason(lines, asks[-1]), complete=footed)
    if any(_BUSY.search(line) for line in tail) or any(_SPINNER.match(line) for line in lines):
        return Reading(Seen.WORKING)
    if _input_box(lines):
        return Reading(Seen.PROMPT, complete=any(_IDLE_HINT.search(line) for line in tail))
    reading = dialog(nonblank(lines))
    return Reading(reading.seen, reading.reason, complete=footed)


def _input_box(lines: list[str]) -> bool:
    """A prompt line between two rules (the box may hold several lines of typed text)."""
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    return any(
        b - a >= 2 and _INPUT.match(lines[a + 1])
        for a, b in itertools.pairwise(rules)
        if b - a <= 12
    )


def _permission_reason(lines: list[str], ask: int) -> str:
    """'<title>: <what>' of the permission prompt whose question is on line `ask`: the title
    below the rule that opens the prompt, and the first line of the dashed box (the command) or
    else the question itself."""
    opened = max((i for i in range(ask) if _RULE.match(lines[i])), default=-1)
    body = [text_of(line) for line in lines[opened + 1 : ask] if not _DASHED.match(line)]
    body = [t for t in body if t and not t.startswith("Tip:")]
    dashed = [i for i in range(opened + 1, ask) if _DASHED.match(lines[i])]
    what = text_of(lines[dashed[0] + 1]) if dashed else text_of(lines[ask])
    title = body[0] if body else "permission"
    return one_line(f"{title}: {what}" if what != title else title)
