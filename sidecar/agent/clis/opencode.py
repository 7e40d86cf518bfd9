"""What the sidecar knows about opencode (1.18.33): how its screen reads (captured in
tests/screens/opencode/), how it is started with its server on a loopback port of ours behind a
per-launch password, and what its server's events mean for the agent's state and approvals. All
of the sidecar's knowledge of opencode belongs here (the live connection: `opencode_events`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.agent.approvals import Answer
from sidecar.agent.screens import Reading, Seen, dialog, nonblank
from sidecar.core.contract import AgentStateName, Decision, InputKey
from sidecar.core.text import one_line
from sidecar.pane.screen import Screen

# ---- how it is started --------------------------------------------------------------------
# The TUI serves its HTTP API on a port only when `--port` or `--hostname` is on its argv (else
# in-process); OPENCODE_SERVER_PASSWORD makes every route need HTTP basic auth as `opencode`.
# Flags and environment only: the user's config files are neither read nor written by us, and
# `--port` beats a `server.port` of theirs.
PASSWORD_ENV = "OPENCODE_SERVER_PASSWORD"  # noqa: S105 - the variable's name
USER = "opencode"  # basic auth's user name (OPENCODE_SERVER_USERNAME's default)
_SESSION_FLAGS = frozenset({"--continue", "-c", "--session", "-s"})


def launch_argv(
    argv: tuple[str, ...], *, host: str, port: int, session_id: str | None
) -> tuple[str, ...]:
    """`argv` (the registry's) with the server on `host`:`port`, and `session_id` resumed by
    id in place of whatever session flags the registry gave (`--continue` picks the latest)."""
    args = list(argv)
    if session_id is not None:
        kept: list[str] = [args[0]]
        skip = False
        for arg in args[1:]:
            if skip:
                skip = False
            elif arg in _SESSION_FLAGS:
                skip = arg in ("--session", "-s")
            elif not arg.startswith(("--session=", "-s=")):
                kept.append(arg)
        args = [*kept, "--session", session_id]
    return (*args, "--port", str(port), "--hostname", host)


# ---- what its events mean -----------------------------------------------------------------
# The server's `/event` stream (server-sent events, one JSON object per `data:` line):
# `session.status` {sessionID, status: {type: busy | retry | idle}} for every session, subagents'
# included; `permission.asked` {id: "per…", sessionID, permission (the tool: bash, edit, …),
# patterns, metadata (bash: {command}), always}; `permission.replied` {sessionID, requestID,
# reply: once | always | reject} whoever replied (the TUI or `POST /permission/{id}/reply`);
# `question.asked` / `.replied` / `.rejected` (the question tool); `session.created` /
# `.updated` {info: {id, parentID?}} (a subagent's session has a parent).


@dataclass(frozen=True)
class Effect:
    state: AgentStateName | None  # None: nothing to say about the state
    reason: str | None = None
    session_id: str | None = None  # the conversation the person works in, when it changes


@dataclass(frozen=True)
class Ask:
    """A permission request: `key` is opencode's id for it (the reply goes to that id)."""

    key: str
    tool: str
    input: Any


@dataclass
class Turns:
    """What opencode's sessions are doing, from its events: busy sessions mean `working`, an
    open permission request or question means `waiting`, none of either means `idle`."""

    busy: set[str] = field(default_factory=set)
    asking: dict[str, str] = field(default_factory=dict)  # open requests: id -> reason
    children: set[str] = field(default_factory=set)  # subagents' sessions
    session_id: str | None = None

    def sync(self, status: Mapping[str, Any], pending: list[Any]) -> Effect:
        """The state from `GET /session/status` and `GET /permission` (a connection made or
        made again: the events before it were missed)."""
        self.busy = {s for s, v in status.items() if isinstance(v, dict) and _busy(v)}
        self.asking = {}
        for item in pending:
            if isinstance(item, dict) and (ask := permission_ask(item)) is not None:
                self.asking[ask.key] = ask_reason(ask)
        return self._now(None)

    def apply(self, event: Mapping[str, Any]) -> Effect:
        kind, props = event.get("type"), event.get("properties")
        if not isinstance(props, dict):
            return Effect(None)
        session = props.get("sessionID")
        found = None
        if kind in ("session.created", "session.updated"):
            info = props.get("info")
            if isinstance(info, dict) and info.get("parentID") and isinstance(session, str):
                self.children.add(session)
            return Effect(None)
        if kind == "session.status" and isinstance(session, str):
            status = props.get("status")
            if isinstance(status, dict) and _busy(status):
                self.busy.add(session)
                if session not in self.children and session != self.session_id:
                    self.session_id = found = session  # a turn in another conversation
            else:
                self.busy.discard(session)
        elif kind == "session.idle" and isinstance(session, str):
            self.busy.discard(session)
        elif kind == "permission.asked" and (ask := permission_ask(props)) is not None:
            self.asking[ask.key] = ask_reason(ask)
        elif kind == "permission.replied":
            self.asking.pop(str(props.get("requestID")), None)
        elif kind == "question.asked" and isinstance(props.get("id"), str):
            self.asking[props["id"]] = _question_reason(props.get("questions"))
        elif kind in ("question.replied", "question.rejected"):
            self.asking.pop(str(props.get("requestID")), None)
        else:
            return Effect(None)
        return self._now(found)

    def _now(self, session_id: str | None) -> Effect:
        if self.asking:
            return Effect("waiting", next(reversed(self.asking.values())), session_id)
        return Effect("working" if self.busy else "idle", None, session_id)


def _busy(status: Mapping[str, Any]) -> bool:
    return status.get("type") in ("busy", "retry")


def permission_ask(props: Mapping[str, Any]) -> Ask | None:
    """The request a `permission.asked` event (or a `GET /permission` item) carries."""
    key, tool = props.get("id"), props.get("permission")
    if not isinstance(key, str) or not isinstance(tool, str):
        return None
    metadata = props.get("metadata")
    tool_input: dict[str, Any] = dict(metadata) if isinstance(metadata, dict) else {}
    patterns = props.get("patterns")
    if isinstance(patterns, list) and patterns:
        tool_input.setdefault("patterns", patterns)
    return Ask(key, tool, tool_input)


def ask_reason(ask: Ask) -> str:
    """'bash: touch x': the tool and what it acts on (the command, the path, the patterns)."""
    data = ask.input
    for key in ("command", "filepath", "filePath", "path", "url"):
        if isinstance(data.get(key), str) and data[key].strip():
            return f"{ask.tool}: {data[key]}"
    patterns = data.get("patterns")
    if isinstance(patterns, list) and patterns:
        return f"{ask.tool}: {' '.join(str(p) for p in patterns)}"
    return ask.tool


def _question_reason(questions: Any) -> str:
    first = questions[0] if isinstance(questions, list) and questions else None
    text = first.get("question") if isinstance(first, dict) else None
    return f"question: {text}" if isinstance(text, str) and text else "question"


def replied(props: Mapping[str, Any]) -> tuple[str, Decision] | None:
    """(request id, decision) of a `permission.replied` event's properties."""
    key, reply = props.get("requestID"), props.get("reply")
    if not isinstance(key, str) or reply not in ("once", "always", "reject"):
        return None
    return key, "deny" if reply == "reject" else "allow"


Reply = Literal["once", "always", "reject"]


def reply_body(answer: Answer) -> dict[str, Any]:
    """The body of `POST /permission/{id}/reply` that gives opencode `answer`."""
    if answer.decision == "allow":
        reply: Reply = "always" if answer.remember else "once"
        return {"reply": reply}
    return {"reply": "reject", **({"message": answer.message} if answer.message else {})}


# ---- what its screen shows --------------------------------------------------------------------
# The input prompt is a box with a heavy left bar: "┃" lines, the last of them the agent and
# model ("┃  Build · Stub Model Stub"), closed by "╹▀▀▀…"; the cursor is in it. The transcript
# uses the same bar for messages and tool output, so the box is known by its closing line and
# the cursor. Under the box a status line says "esc interrupt" while a turn runs (the prompt
# still takes typing). Dialogs are overlays headed "<title> … esc" that take the cursor into
# their search field or hide it; a permission prompt replaces the box: "△ Permission required",
# "<icon> <title>" ("# Shell command"), the command ("$ touch x"), "Allow once  Allow always
# Reject" (then "△ Always allow" asks to confirm the patterns; "△ Reject permission", which asks
# a subagent's reason, is taken from the binary's strings, not seen on screen).

_BOTTOM = re.compile(r"^(\s*)╹▀{5,}")
_BAR = "┃"
_BOX_ROWS = 14  # the box grows with typed text; beyond this it scrolls
_BUSY = re.compile(r"\besc (again to )?interrupt\b")
_DIALOG_HEAD = re.compile(r"\S\s{3,}esc(/enter)?\s*$")
_ASKS = re.compile(r"^△ (Permission required|Always allow|Reject permission)\b")
_ICON = re.compile(r"^\W\s+")  # the tool's icon before a permission's title: # → ← % ⚙ ✱
_COMMAND = re.compile(r"^\$ (.+)$")
_PATTERN = re.compile(r"^- (.+)$")
_PROMPT_ROWS = 10  # a permission prompt's heading, title, command and choices


def read_screen(screen: Screen) -> Reading:
    """What opencode's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    cells = [_first_cell(line) for line in lines]
    for at, cell in enumerate(cells):
        if asked := _ASKS.match(cell):
            return Reading(Seen.PERMISSION, _permission_reason(asked.group(1), cells[at + 1 :]))
    heads = [line for line in lines if _DIALOG_HEAD.search(line)]
    if heads:
        return dialog(lines, title=_first_cell(heads[0]))
    bottom = _box_bottom(lines)
    status = lines[bottom + 1] if bottom is not None and bottom + 1 < len(lines) else ""
    if _BUSY.search(status) or (bottom is None and _BUSY.search(" ".join(nonblank(lines)[-2:]))):
        return Reading(Seen.WORKING)
    if bottom is not None and _in_box(screen, bottom):
        return Reading(Seen.PROMPT)
    return dialog(nonblank(lines)[-12:])


def approval_keys(decision: Decision, remember: bool) -> tuple[InputKey, ...]:
    """The keys (`/input`'s names) that answer its permission prompt on screen, for when its
    server is not reachable: "Allow once" is selected first; "Allow always" asks to confirm
    ("Confirm" selected first); "Reject" is the third choice (all three seen on 1.18.33)."""
    if decision == "deny":
        return ("Right", "Right", "Enter")
    return ("Right", "Enter", "Enter") if remember else ("Enter",)


def _box_bottom(lines: list[str]) -> int | None:
    found = [at for at, line in enumerate(lines) if _BOTTOM.match(line)]
    return found[-1] if found else None


def _in_box(screen: Screen, bottom: int) -> bool:
    """Whether the cursor stands in the prompt box that `bottom` closes."""
    lines, row = screen.lines, screen.cursor_row
    found = _BOTTOM.match(lines[bottom])
    left = len(found.group(1)) if found else 0
    if not bottom - _BOX_ROWS <= row < bottom or screen.cursor_col <= left:
        return False
    return all(lines[at][left : left + 1] == _BAR for at in range(row, bottom))


def _permission_reason(title: str, below: list[str]) -> str:
    """'<title>: <command or pattern>' of a permission prompt, from the lines below its
    heading: the tool's own title ("# Shell command") replaces "Permission required"."""
    below = [cell for cell in below[:_PROMPT_ROWS] if cell]
    if title == "Permission required" and below:
        title = _ICON.sub("", below[0])
    for cell in below:
        if found := _COMMAND.match(cell) or _PATTERN.match(cell):
            return f"{title}: {found.group(1)}"
    return title


def _first_cell(line: str) -> str:
    """The first of the columns a line is laid out in (parted by two or more spaces), without
    the bar or frame around it: the sidebar's text shares rows with the transcript. A `|`
    inside it stays: it is a command's pipe, not a frame (`screens.text_of` drops it)."""
    return one_line(re.split(r"\s{2,}", line.strip(" ┃│"), maxsplit=1)[0])
