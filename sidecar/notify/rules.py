"""When a person is told: the rules, read off the event bus.

- `waiting` (a permission request, or a dialog with none) only once it has lasted the dwell: a
  prompt answered within it is never sent;
- `idle` when a turn ends, `exited` when the CLI ends by itself or cannot start, `budget`;
- one of a kind per cooldown: what comes meanwhile is held, and at the cooldown's end the one
  still true is sent (a permission request first, oldest first) — held, not lost;
- nothing while a person types in the web terminal, except permission requests;
- a sent `waiting` that stops being true (answered elsewhere, the dialog gone) is withdrawn.

Only timers: nothing runs while nothing happens.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol

from msgspec import UnsetType

from sidecar.core.contract import AgentStateName
from sidecar.core.event_shapes import (
    AgentStateEvent,
    ApprovalRequested,
    ApprovalResolved,
    CliExit,
    ErrorEvent,
    Event,
)
from sidecar.core.shapes import NotifyKindName
from sidecar.notify.notice import Notice

log = logging.getLogger(__name__)

DIALOG = "dialog"  # the key of a `waiting` with no permission request


@dataclass(eq=False)
class Due:
    """Something a person should be told. `key`: what it is about (an approval's id, `dialog`,
    or the kind itself), so that a later event can take it back."""

    kind: NotifyKindName
    key: str
    reason: str | None = None
    approval: str | None = None

    @property
    def quiet(self) -> bool:
        """Held back while a person types (everything but a permission request)."""
        return self.approval is None


class Facts(Protocol):
    """What the rules ask about the sleeve now."""

    def agent_state(self) -> AgentStateName: ...

    def approval_open(self, approval_id: str) -> bool: ...

    def approval_kind(self, approval_id: str) -> str: ...

    def approvals_open(self) -> bool: ...


class Outlet(Protocol):
    """Where the rules' decisions go."""

    def send(self, due: Due) -> Notice: ...

    def withdraw(self, notice: Notice) -> None: ...

    def suppress(self, due: Due, why: str) -> None: ...

    def typing(self) -> bool: ...


class Rules:
    def __init__(
        self, on: Collection[str], dwell: float, cooldown: float, facts: Facts, outlet: Outlet
    ) -> None:
        self.on = frozenset(on)
        self.dwell = dwell
        self.cooldown = cooldown
        self.facts = facts
        self.outlet = outlet
        self._reason: str | None = None  # the agent's, while it waits
        self._dwelling: dict[str, asyncio.TimerHandle] = {}  # by key
        self._sent: dict[str, Notice] = {}  # what may be withdrawn, by key
        self._last: dict[str, float] = {}  # loop time of the last send, by kind
        self._held: dict[str, list[Due]] = {}  # held by the cooldown, by kind
        self._cooling: dict[str, asyncio.TimerHandle] = {}  # the cooldown's end, by kind
        self.closed = False

    # ---- the events ---------------------------------------------------------------------------

    def event(self, event: Event) -> None:
        if self.closed:
            return
        if isinstance(event, AgentStateEvent):
            self._agent(event)
        elif isinstance(event, ApprovalRequested):
            egress = self.facts.approval_kind(event.id) == "egress"
            kind: NotifyKindName = "egress" if egress else "waiting"
            if kind in self.on:
                self._dwell(event.id, Due(kind, event.id, approval=event.id))
        elif isinstance(event, ApprovalResolved):
            self._over(event.id)
        elif isinstance(event, CliExit):
            why = f"the CLI ({event.cli}) exited, code {event.exit_code}"
            self._offer(Due("exited", "exited", why))
        elif isinstance(event, ErrorEvent) and not isinstance(event.cli, UnsetType):
            self._offer(Due("exited", "exited", event.message))  # it cannot start (fatal)
        elif type(event).__struct_config__.tag == "budget":
            self._offer(Due("budget", "budget", getattr(event, "message", None) or "budget"))

    def _agent(self, event: AgentStateEvent) -> None:
        if event.state == "waiting":
            self._reason = event.reason
            if "waiting" in self.on and DIALOG not in self._sent:
                self._dwell(DIALOG, Due("waiting", DIALOG))
        else:
            self._over(DIALOG)
        if event.state == "idle" and event.previous == "working":
            self._offer(Due("idle", "idle", "the turn ended"))

    def _dwell(self, key: str, due: Due) -> None:
        if key in self._dwelling:
            return
        loop = asyncio.get_running_loop()
        self._dwelling[key] = loop.call_later(self.dwell, self._dwelt, due)

    def _dwelt(self, due: Due) -> None:
        self._dwelling.pop(due.key, None)
        if due.key == DIALOG:
            if self.facts.approvals_open():
                return  # a permission request is on screen: its own notification tells
            due.reason = self._reason
        self._offer(due)

    def _over(self, key: str) -> None:
        """What `key` is about is over: nothing more is sent, and what was is withdrawn."""
        timer = self._dwelling.pop(key, None)
        if timer is not None:
            timer.cancel()
        sent = self._sent.pop(key, None)
        if sent is not None:
            self.outlet.withdraw(sent)

    # ---- the cooldown -------------------------------------------------------------------------

    def still(self, due: Due) -> bool:
        """Whether `due` is still true (checked again when the cooldown lets it go)."""
        if due.approval is not None:
            return self.facts.approval_open(due.approval)
        state = self.facts.agent_state()
        if due.key == DIALOG:
            return state == "waiting" and not self.facts.approvals_open()
        if due.kind in ("idle", "exited"):
            return state == due.kind
        return True

    def _offer(self, due: Due) -> None:
        if due.kind not in self.on:
            return
        if due.quiet and self.outlet.typing():
            self.outlet.suppress(due, "typing")
            return
        loop = asyncio.get_running_loop()
        last = self._last.get(due.kind)
        if last is not None and loop.time() - last < self.cooldown:
            self._hold(due, last + self.cooldown)
            return
        self._last[due.kind] = loop.time()
        notice = self.outlet.send(due)
        if due.key == DIALOG or due.approval is not None:
            self._sent[due.key] = notice

    def _hold(self, due: Due, until: float) -> None:
        held = self._held.setdefault(due.kind, [])
        if due.approval is None:
            # Of the rest, only the newest is worth telling.
            for old in [d for d in held if d.approval is None]:
                held.remove(old)
                self.outlet.suppress(old, "cooldown")
        held.append(due)
        if due.kind not in self._cooling:
            loop = asyncio.get_running_loop()
            self._cooling[due.kind] = loop.call_at(until, self._cooled, due.kind)

    def _cooled(self, kind: str) -> None:
        self._cooling.pop(kind, None)
        held = self._held.pop(kind, [])
        live = []
        for due in held:
            if self.still(due):
                live.append(due)
            else:
                self.outlet.suppress(due, "over")
        if not live:
            return
        first = next((d for d in live if d.approval is not None), live[-1])
        self._offer(first)
        for due in live:
            if due is not first:
                self._offer(due)  # held again, for the next cooldown's end

    def close(self) -> None:
        self.closed = True
        for timer in [*self._dwelling.values(), *self._cooling.values()]:
            timer.cancel()
        self._dwelling.clear()
        self._cooling.clear()
        self._held.clear()
