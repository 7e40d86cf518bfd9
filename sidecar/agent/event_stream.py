"""What a CLI whose own server streams its events declares (`EventStream`), so that one event
source (`sidecar.agent.event_source`) reads it: how it is started with its server on a loopback
port of ours behind a per-launch password, the routes to read, what its events mean for the
agent's state (`Turns`), which of them open or close a permission request, how a request is
answered, and what its model requests used (`Bill`). All pure: the event source makes the
connections.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sidecar.agent.hooks import HookEffect, PermissionAsk
from sidecar.usage.reports import UsageReport

if TYPE_CHECKING:  # the init process imports the registry: no asyncio in it
    from sidecar.agent.approvals import Answer
    from sidecar.core.contract import Decision

Event = Mapping[str, Any]  # one event of the stream (a JSON object)


class Turns(Protocol):
    """What the CLI's sessions are doing, from its events (a new one for each connection)."""

    def sync(self, documents: Sequence[Any]) -> HookEffect:
        """The state from the answers of `EventStream.status`'s routes, in order (a stream made
        or made again: the events before it were missed)."""
        ...

    def apply(self, event: Event) -> HookEffect: ...


class Bill(Protocol):
    """The model requests the CLI's events report, each once (a new one for each run)."""

    def read(self, event: Event) -> UsageReport | None:
        """The usage of the model request `event` ends; raises BadReport for counts or a cost
        no real request has."""
        ...


@dataclass(frozen=True)
class EventStream:
    # (the registry's argv, host, port, pinned session id) -> the argv that serves on host:port
    # and resumes that session
    launch: Callable[[tuple[str, ...], str, int, str | None], tuple[str, ...]]
    password_env: str  # the variable that gives its server the launch's password
    user: str  # the user name of HTTP basic auth
    path: str  # the route of its server-sent events
    status: tuple[str, ...]  # routes whose JSON says what a new connection missed (`Turns.sync`)
    turns: Callable[[str | None], Turns]  # a new tracker, given the pinned session id
    # The permission requests open in the status routes' answers (`status`, in order).
    pending: Callable[[Sequence[Any]], list[PermissionAsk]]
    asked: Callable[[Event], PermissionAsk | None]  # the request an event opens (with its key)
    replied: Callable[[Event], tuple[str, Decision] | None]  # (key, decision) a reply event gives
    reply: Callable[[str, Answer], tuple[str, Mapping[str, Any]]]  # the route and JSON body
    bill: Callable[[], Bill] | None = None  # its model requests' usage; None: not in its events
