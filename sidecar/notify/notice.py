"""One notification as every channel sends it: what happened, the agent's state, the approval
with its links, and the words a phone shows (a title and one line)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import msgspec
from msgspec import UNSET, UnsetType

from sidecar.core.contract import AgentStateName, rfc3339
from sidecar.core.masks import scrub, scrub_text
from sidecar.core.shapes import (
    ChannelName,
    NotificationAgent,
    NotificationApproval,
    NotifyKindName,
    WebhookNotification,
)
from sidecar.core.text import one_line

TITLE_CHARS = 80
BODY_CHARS = 240

_encode = msgspec.json.Encoder().encode


def new_id() -> str:
    return "n" + secrets.token_hex(6)


@dataclass(eq=False)
class Notice:
    event: NotifyKindName
    sleeve_id: str
    state: AgentStateName  # the agent's
    reason: str | None
    approval: NotificationApproval | None = None
    url: str | None = None  # the dashboard
    id: str = field(default_factory=new_id)
    time: str = field(default_factory=rfc3339)
    # Set once it is no longer true (the approval was answered elsewhere): not sent from then on.
    withdrawn: bool = False
    delivered: set[ChannelName] = field(default_factory=set)  # where a withdrawal must go

    @property
    def urgent(self) -> bool:
        """Someone must act for the agent to go on."""
        return self.approval is not None or self.event == "waiting"

    @property
    def title(self) -> str:
        a = self.approval
        if a is not None:
            what = "reach a host" if a.kind == "egress" else f"use {a.tool}"
            text = f"{self.sleeve_id} asks to {what}"
        else:
            text = {
                "waiting": f"{self.sleeve_id} is waiting for you",
                "idle": f"{self.sleeve_id} finished its turn",
                "exited": f"{self.sleeve_id}: the CLI stopped",
                "budget": f"{self.sleeve_id}: budget",
                "test": f"{self.sleeve_id}: test notification",
            }.get(self.event, f"{self.sleeve_id}: {self.event}")
        return one_line(text, TITLE_CHARS)

    @property
    def body(self) -> str:
        if self.approval is not None:
            return one_line(scrub_text(self.approval.summary), BODY_CHARS)
        if self.event == "test":
            return "Notifications from this sleeve reach you here."
        return one_line(scrub_text(self.reason or self.state), BODY_CHARS)

    def webhook_body(self) -> bytes:
        return scrub(
            _encode(
                WebhookNotification(
                    id=self.id,
                    event=self.event,
                    sleeve_id=self.sleeve_id,
                    agent=NotificationAgent(state=self.state, reason=self.reason),
                    approval=self.approval if self.approval is not None else UNSET,
                    url=self.url,
                    time=self.time,
                )
            )
        )

    def actions(self) -> dict[str, str] | None:
        a = self.approval
        if a is None or isinstance(a.actions, UnsetType):
            return None
        return {"allow": a.actions.allow, "deny": a.actions.deny}
