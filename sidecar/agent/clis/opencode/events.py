"""opencode's event stream (1.18.33): how it is started with its server on a loopback port of
ours behind a per-launch password, and what its server's events mean for the agent's state and
approvals (`STREAM`, its usage read by `usage`; the connection itself is
`sidecar.agent.event_source`'s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from sidecar.agent.clis.opencode.usage import Bill
from sidecar.agent.event_stream import Event, EventStream
from sidecar.agent.hooks import HookEffect, PermissionAsk

if TYPE_CHECKING:  # the init process imports the registry: no asyncio in it
    from sidecar.agent.approvals import Answer
    from sidecar.core.contract import Decision

# ---- how it is started --------------------------------------------------------------------
# The TUI serves its HTTP API on a port only when `--port` or `--hostname` is on its argv (else
# in-process); OPENCODE_SERVER_PASSWORD makes every route need HTTP basic auth as `opencode`.
# Flags and environment only: the user's config files are neither read nor written by us, and
# `--port` beats a `server.port` of theirs.
PASSWORD_ENV = "OPENCODE_SERVER_PASSWORD"  # noqa: S105 - the variable's name
USER = "opencode"  # basic auth's user name (OPENCODE_SERVER_USERNAME's default)
_SESSION_FLAGS = frozenset({"--continue", "-c", "--session", "-s"})


def launch_argv(
    argv: tuple[str, ...], host: str, port: int, session_id: str | None
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


# An effect's `session_id` is the conversation the person works in, when it changes; a
# request's `key` is opencode's id for it (the reply goes to that id).
STATUS = ("/session/status", "/permission")  # the sessions at work, the requests open


@dataclass
class Turns:
    """What opencode's sessions are doing, from its events: busy sessions mean `working`, an
    open permission request or question means `waiting`, none of either means `idle`."""

    busy: set[str] = field(default_factory=set)
    asking: dict[str | None, str] = field(default_factory=dict)  # open requests: id -> reason
    children: set[str] = field(default_factory=set)  # subagents' sessions
    session_id: str | None = None

    def sync(self, documents: Sequence[Any]) -> HookEffect:
        """The state from `GET /session/status` and `GET /permission` (`STATUS`: a connection
        made or made again, the events before it were missed)."""
        status = documents[0] if documents and isinstance(documents[0], dict) else {}
        self.busy = {s for s, v in status.items() if isinstance(v, dict) and _busy(v)}
        self.asking = {ask.key: ask_reason(ask) for ask in pending(documents)}
        return self._now(None)

    def apply(self, event: Event) -> HookEffect:
        kind, props = event.get("type"), event.get("properties")
        if not isinstance(props, dict):
            return HookEffect(None)
        session = props.get("sessionID")
        found = None
        if kind in ("session.created", "session.updated"):
            info = props.get("info")
            if isinstance(info, dict) and info.get("parentID") and isinstance(session, str):
                self.children.add(session)
            return HookEffect(None)
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
            return HookEffect(None)
        return self._now(found)

    def _now(self, session_id: str | None) -> HookEffect:
        if self.asking:
            return HookEffect("waiting", next(reversed(self.asking.values())), session_id)
        return HookEffect("working" if self.busy else "idle", None, session_id)


def _busy(status: Mapping[str, Any]) -> bool:
    return status.get("type") in ("busy", "retry")


def permission_ask(props: Mapping[str, Any]) -> PermissionAsk | None:
    """The request a `permission.asked` event (or a `GET /permission` item) carries."""
    key, tool = props.get("id"), props.get("permission")
    if not isinstance(key, str) or not isinstance(tool, str):
        return None
    metadata = props.get("metadata")
    tool_input: dict[str, Any] = dict(metadata) if isinstance(metadata, dict) else {}
    patterns = props.get("patterns")
    if isinstance(patterns, list) and patterns:
        tool_input.setdefault("patterns", patterns)
    return PermissionAsk(tool, tool_input, key)


def pending(documents: Sequence[Any]) -> list[PermissionAsk]:
    """The requests open in `GET /permission`'s answer (`STATUS`' second)."""
    items = documents[1] if len(documents) > 1 and isinstance(documents[1], list) else []
    found = [permission_ask(item) for item in items if isinstance(item, dict)]
    return [ask for ask in found if ask is not None]


def asked(event: Event) -> PermissionAsk | None:
    """The request a `permission.asked` event opens."""
    props = event.get("properties")
    if event.get("type") != "permission.asked" or not isinstance(props, dict):
        return None
    return permission_ask(props)


def ask_reason(ask: PermissionAsk) -> str:
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


def reply(key: str, answer: Answer) -> tuple[str, dict[str, Any]]:
    """The route and body that give opencode `answer` to request `key`."""
    return f"/permission/{key}/reply", reply_body(answer)


def _replied_in(event: Event) -> tuple[str, Decision] | None:
    props = event.get("properties")
    if event.get("type") != "permission.replied" or not isinstance(props, dict):
        return None
    return replied(props)


STREAM = EventStream(
    launch_argv,
    PASSWORD_ENV,
    USER,
    "/event",
    STATUS,
    lambda session_id: Turns(session_id=session_id),
    pending,
    asked,
    _replied_in,
    reply,
    Bill,
)
