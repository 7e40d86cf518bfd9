"""What a CLI whose hooks report to the sidecar must tell it (`HookCLI`), so that one hook source
serves them all: how to launch it with our hooks (a config of ours layered over the user's, never
the user's own files), what each event means for the agent's state, which events are permission
requests to hold, and how the CLI takes an answer to one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sidecar.agent.approvals import Answer
from sidecar.agent.registry import CLIDef
from sidecar.core.contract import AgentStateName
from sidecar.core.loopback import loopback_url

HOOK_PATH = "/hooks"  # a CLI's events are POSTed to HOOK_PATH/<cli knowledge name>/<event>
SECRET_HEADER = "X-Sidecar-Hook"  # noqa: S105 - the header's name, not a secret


def hook_base_url(host: str, port: int, cli: str) -> str:
    """Where a CLI POSTs its events (base + event name), given the API's bind address."""
    return f"{loopback_url(host, port)}{HOOK_PATH}/{cli}/"


@dataclass(frozen=True)
class HookLaunch:
    """What the sidecar knows when it starts a CLI with hooks."""

    cli: CLIDef
    argv: tuple[str, ...]  # the registry's argv for this start (command or resume)
    env: Mapping[str, str]  # the CLI's environment
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
    state: AgentStateName | None  # None: the event says nothing about the state
    reason: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class PermissionAsk:
    """A hook event that asks for permission and waits for the hook's answer."""

    tool: str
    input: Any
    key: str | None = None  # the CLI's own id for the request, when it gives one


class HookCLI(Protocol):
    name: str  # the knowledge name (`CLIDef.screen`): its hooks' URL segment
    events: tuple[str, ...]
    max_hold: float  # seconds a held hook may wait: under the CLI's own timeout for it
    decides: bool  # its permission hook takes a decision (else its dialog is answered by keys)
    # The CLI reads our settings only from a file root owns, in directories only root may write
    # (Gemini's system files): with SIDECAR_USER the sidecar makes it, group-readable by the user.
    root_settings: bool
    reports_at_start: bool  # a hook reports as it starts (else only once a turn begins)

    def launch(self, launch: HookLaunch) -> Launched: ...

    def interpret(self, event: str, payload: dict[str, Any]) -> HookEffect: ...

    def permission(self, event: str, payload: dict[str, Any]) -> PermissionAsk | None: ...

    def answer(self, answer: Answer, payload: dict[str, Any]) -> dict[str, Any]:
        """The held hook's reply that gives the CLI `answer`."""
        ...
