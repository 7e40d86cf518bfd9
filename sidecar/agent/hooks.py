"""What a CLI whose hooks report to the sidecar declares (`Hooks`), so that one hook source
serves them all: how to launch it with our hooks (a config of ours layered over the user's, never
the user's own files), what each event means for the agent's state, which event is a permission
request to hold, and how the CLI takes an answer to one. The holding and answering are shared;
each CLI gives data and its pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.core.contract import AgentStateName
from sidecar.core.loopback import loopback_url

if TYPE_CHECKING:  # the init process imports the registry: no asyncio in it
    from sidecar.agent.approvals import Answer

HOOK_PATH = "/hooks"  # a CLI's events are POSTed to HOOK_PATH/<cli knowledge name>/<event>
SECRET_HEADER = "X-Sidecar-Hook"  # noqa: S105 - the header's name, not a secret
# An event's name is the last segment of its URL (`hook_relay` swaps it in): no '/', no space.
EVENT_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")


def hook_base_url(host: str, port: int, cli: str) -> str:
    """Where a CLI POSTs its events (base + event name), given the API's bind address."""
    return f"{loopback_url(host, port)}{HOOK_PATH}/{cli}/"


@dataclass(frozen=True)
class HookLaunch:
    """What the sidecar knows when it starts a CLI with hooks."""

    command: tuple[str, ...]  # the registry entry's command (a resume by id starts from it)
    argv: tuple[str, ...]  # the registry's argv for this start (command or resume)
    env: Mapping[str, str]  # the CLI's environment, the registry entry's own variables included
    base_url: str  # an event's URL is base_url + event name
    secret: str  # the per-launch secret, sent in SECRET_HEADER
    settings_path: Path  # a file of ours the CLI's user can read (0600), for the CLI's config
    session_id: str | None  # the conversation to resume or to name, when one is pinned
    workspace: Path
    has_history: bool


@dataclass(frozen=True)
class Launched:
    argv: tuple[str, ...]
    settings: Mapping[str, Any]  # written as JSON to `settings_path` before the start
    session_id: str | None  # the conversation pinned (None: learnt from the hooks)
    env: Mapping[str, str] = field(default_factory=dict)  # added to the CLI's environment


@dataclass(frozen=True)
class HookEffect:
    """What an event says about the agent: a hook's, or one of a CLI's event stream."""

    state: AgentStateName | None  # None: the event says nothing about the state
    reason: str | None = None
    session_id: str | None = None
    # A notification of a state already reported (a permission prompt the hooks announced):
    # the reason given first stands.
    restates: bool = False


@dataclass(frozen=True)
class PermissionAsk:
    """A hook event that asks for permission and waits for the hook's answer."""

    tool: str
    input: Any
    key: str | None = None  # the CLI's own id for the request, when it gives one


@dataclass(frozen=True)
class Hooks:
    """A CLI's hooks. `launch` and `interpret` are the CLI's own (pure: the hook source applies
    what they return); the rest is data."""

    events: tuple[str, ...]  # the events its hooks report, each POSTed to .../<event>
    launch: Callable[[HookLaunch], Launched]
    interpret: Callable[[str, dict[str, Any]], HookEffect]
    # The event that asks for permission and waits for the hook's reply (None: the CLI's hooks
    # take no decision, its dialog is answered by keys on screen).
    permission_event: str | None = None
    max_hold: float = 0.0  # seconds a held hook may wait: under the CLI's own timeout for it
    # The reply to an `allow` + `remember` takes the CLI's own "don't ask again" suggestions
    # (`permission_suggestions`), for this session only (else an allow is for that request).
    remembers: bool = False
    # The CLI reads our settings only from a file root owns, in directories only root may write
    # (Gemini's system files): with SIDECAR_USER the sidecar makes it, group-readable by the user.
    root_settings: bool = False
    reports_at_start: bool = False  # a hook reports as it starts (else only once a turn begins)
    # The event a submitted prompt raises before the model is called, the CLI waiting for the
    # hook's answer (`sidecar.agent.prompt_submit` confirms a typed prompt by it).
    submit_event: str | None = None

    @property
    def decides(self) -> bool:
        """Its permission hook takes a decision (else its dialog is answered by keys)."""
        return self.permission_event is not None

    def permission(self, event: str, payload: dict[str, Any]) -> PermissionAsk | None:
        """The permission request to hold until it is answered, if `event` is one."""
        if event != self.permission_event:
            return None
        tool = payload.get("tool_name")
        return PermissionAsk(tool if isinstance(tool, str) else "tool", payload.get("tool_input"))

    def answer(self, answer: Answer, payload: dict[str, Any]) -> dict[str, Any]:
        """The held hook's reply that gives the CLI `answer` (the shape Claude Code and Codex
        share: a decision of `behavior` and a deny's `message`)."""
        decision: dict[str, Any] = {"behavior": answer.decision}
        if answer.decision == "deny" and answer.message:
            decision["message"] = answer.message
        suggestions = payload.get("permission_suggestions")
        remember = self.remembers and answer.remember and answer.decision == "allow"
        if remember and isinstance(suggestions, list):
            decision["updatedPermissions"] = [
                {**s, "destination": "session"} for s in suggestions if isinstance(s, dict)
            ]
        output = {"hookEventName": self.permission_event, "decision": decision}
        return {"hookSpecificOutput": output}

    def problem(self) -> tuple[str, str] | None:
        """(field, what is wrong) when the declaration contradicts itself, else None."""
        if not self.events:
            return "hooks.events", "names no event"
        bad = [e for e in self.events if not EVENT_NAME.match(e)]
        if bad:
            return "hooks.events", f"{bad[0]!r} is no event name the relay can post"
        if len(set(self.events)) != len(self.events):
            return "hooks.events", "names an event twice"
        if self.permission_event is not None and self.permission_event not in self.events:
            return "hooks.permission_event", f"{self.permission_event!r} is none of its events"
        if (self.max_hold > 0) != self.decides:
            return "hooks.max_hold", "a hold needs a permission event, and one needs a hold"
        return None
