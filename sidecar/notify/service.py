"""The notifier, wired: the rules (`sidecar.notify.rules`) listen on the event bus, their
decisions become notices handed to each configured channel's queue, and the one-tap links of
approvals are made and opened here. Without a channel it listens to nothing and starts nothing.

The supervisor starts and closes it (closed first at shutdown: a CLI stopped on purpose is not
news); the API tells it when a person types in the web terminal (`presence`), serves its links
(`open_link`, `answer_link`) and reads `info()` for /status and /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from sidecar.agent.approvals import AlreadyAnswered, Answer, Approval, Approvals, NotFound
from sidecar.agent.machine import AgentMachine
from sidecar.config import Config
from sidecar.core.contract import AgentStateName
from sidecar.core.event_shapes import ErrorEvent, NotificationEvent
from sidecar.core.events import EventBus
from sidecar.core.shapes import (
    ChannelInfo,
    ChannelResult,
    NotificationActions,
    NotificationApproval,
    NotifyInfo,
)
from sidecar.notify.channels import Ntfy, Webhook
from sidecar.notify.delivery import Channel, Http, Result, target_of
from sidecar.notify.links import Link, Links
from sidecar.notify.notice import Notice, new_id
from sidecar.notify.rules import Due, Rules
from sidecar.notify.webpush import Devices, VapidKeys, WebPush

log = logging.getLogger(__name__)

# A person counts as typing while a read-write web terminal is attached and typed this recently:
# a dashboard left open in a tab nobody looks at must not silence the sleeve.
TYPING_WINDOW = 60.0


class Presence:
    """The web terminal's writers, as the API's terminal proxy reports them."""

    def __init__(self) -> None:
        self.writers = 0
        self._typed = -math.inf

    def attached(self) -> None:
        self.writers += 1

    def detached(self) -> None:
        self.writers = max(0, self.writers - 1)

    def typed(self) -> None:
        self._typed = time.monotonic()

    def typing(self) -> bool:
        return self.writers > 0 and time.monotonic() - self._typed < TYPING_WINDOW


@dataclass(frozen=True)
class Opened:
    """What a link leads to now. `status`: 200 the approval waits; 409 it was answered (`first`
    says how); 410 it is over (withdrawn, expired, or from a supervisor that crashed); 404 the
    token is not one of ours."""

    status: Literal[200, 404, 409, 410]
    link: Link | None = None
    approval: Approval | None = None
    first: Answer | None = None


class Notifier:
    def __init__(
        self,
        config: Config,
        bus: EventBus,
        machine: AgentMachine,
        approvals: Approvals,
        *,
        link_key: bytes | None = None,
        generation: int = 0,
    ) -> None:
        settings = config.notify
        self.settings = settings
        self.sleeve_id = config.sleeve_name
        self.bus = bus
        self.machine = machine
        self.approvals = approvals
        self.presence = Presence()
        self.http = Http()
        public = settings.public_url
        # A key of its own when none is handed down (a supervisor made outside init: tests).
        key = link_key if link_key is not None else secrets.token_bytes(32)
        self.links = Links(key, generation) if public is not None else None
        self.dashboard = f"{public}/" if public is not None else None
        self.channels: list[Channel] = []
        if settings.webhook is not None:
            self.channels.append(Webhook(settings.webhook, settings.webhook_secret, self.http))
        if settings.ntfy is not None:
            self.channels.append(Ntfy(settings.ntfy, settings.ntfy_token, self.http))
        self.webpush: WebPush | None = None
        if settings.webpush and public is not None:
            paths = config.paths
            keys = VapidKeys(paths.vapid_key, paths.vapid_public, subject=target_of(public))
            self.webpush = WebPush(Devices(paths.push_devices), keys, self.http)
            self.channels.append(self.webpush)
        for channel in self.channels:
            channel.on_failed = self._failed
        self.rules = Rules(settings.on, settings.dwell, settings.cooldown, self, self)
        self._workers: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Listen and start the channels' workers (nothing at all without a channel)."""
        if not self.channels:
            return
        self.bus.listen(self.rules.event)
        self._workers = [
            asyncio.create_task(c.run(), name=f"notify-{c.name}") for c in self.channels
        ]
        log.info("notifications to %s", ", ".join(c.name for c in self.channels))

    async def close(self) -> None:
        self.rules.close()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.http.close()

    # ---- what the rules ask (Facts) -----------------------------------------------------------

    def agent_state(self) -> AgentStateName:
        return self.machine.state

    def approval_open(self, approval_id: str) -> bool:
        return self.approvals.get(approval_id) is not None

    def approval_kind(self, approval_id: str) -> str:
        approval = self.approvals.get(approval_id)
        return approval.kind if approval is not None else "tool"

    def approvals_open(self) -> bool:
        return bool(self.approvals.pending())

    # ---- what the rules decide (Outlet) ------------------------------------------------------

    def typing(self) -> bool:
        return self.presence.typing()

    def send(self, due: Due) -> Notice:
        notice = self._notice(due)
        for channel in self.channels:
            channel.offer("send", notice)
        self._tell(notice, "sent")
        return notice

    def withdraw(self, notice: Notice) -> None:
        notice.withdrawn = True
        for channel in self.channels:
            channel.offer("withdraw", notice)
        self._tell(notice, "withdrawn")

    def suppress(self, due: Due, why: str) -> None:
        for channel in self.channels:
            channel.stats.suppressed += 1
        self.bus.publish(
            NotificationEvent(
                id=new_id(), event=due.kind, outcome="suppressed", approval=due.approval, why=why
            )
        )

    def _tell(self, notice: Notice, outcome: Literal["sent", "withdrawn"]) -> None:
        self.bus.publish(
            NotificationEvent(
                id=notice.id,
                event=notice.event,
                outcome=outcome,
                approval=notice.approval.id if notice.approval is not None else None,
                channels=[c.name for c in self.channels],
            )
        )

    def _failed(self, channel: str, result: Result) -> None:
        self.bus.publish(ErrorEvent(message=f"notification to {channel} failed: {result.detail}"))

    def _notice(self, due: Due) -> Notice:
        status = self.machine.status()
        approval = self.approvals.get(due.approval) if due.approval is not None else None
        return Notice(
            event=due.kind,
            sleeve_id=self.sleeve_id,
            state=status.state,
            reason=due.reason or status.reason,
            approval=self._about(approval) if approval is not None else None,
            url=self.dashboard,
        )

    def _about(self, approval: Approval) -> NotificationApproval:
        egress = approval.kind == "egress"
        about = NotificationApproval(
            id=approval.id,
            kind="egress" if egress else "tool",
            tool=approval.tool,
            summary=approval.summary,
        )
        if self.links is not None:
            base = f"{self.settings.public_url}/a/"
            about.actions = NotificationActions(
                allow=base + self.links.mint(approval.id, "allow"),
                deny=base + self.links.mint(approval.id, "deny"),
            )
        return about

    # ---- links --------------------------------------------------------------------------------

    def open_link(self, token: str) -> Opened:
        """Where `token` leads, deciding nothing (a GET: link previews fetch it)."""
        link = self.links.check(token) if self.links is not None else None
        if link is None:
            return Opened(404)
        assert self.links is not None
        if not self.links.current(link):
            return Opened(410, link)
        approval = self.approvals.get(link.approval_id)
        if approval is not None:
            return Opened(200, link, approval)
        outcome = self.approvals.outcome(link.approval_id)
        if outcome is not None and outcome[0] is not None:
            return Opened(409, link, first=outcome[0])
        return Opened(410, link)  # withdrawn, or forgotten long since

    def answer_link(self, token: str) -> Opened:
        """A POST: the link's decision, once (`by: "link"`); the first answer if another came
        first."""
        opened = self.open_link(token)
        if opened.status != 200 or opened.link is None:
            return opened
        link = opened.link
        try:
            answer = self.approvals.answer(link.approval_id, Answer(link.decision, "link"))
        except AlreadyAnswered as exc:
            if exc.answer is None:
                return Opened(410, link)
            return Opened(409, link, first=exc.answer)
        except NotFound:
            return Opened(410, link)
        return Opened(200, link, opened.approval, first=answer)

    # ---- what the API reads -------------------------------------------------------------------

    def info(self) -> NotifyInfo:
        channels = []
        for c in self.channels:
            info = ChannelInfo(
                name=c.name,
                target=c.target,
                sent=c.stats.sent,
                failed=c.stats.failed,
                suppressed=c.stats.suppressed,
                last=c.stats.last,
            )
            if c is self.webpush:
                info.devices = len(self.webpush.devices.all())
            channels.append(info)
        s = self.settings
        return NotifyInfo(
            channels=channels,
            on=sorted(s.on),
            dwell=s.dwell,
            cooldown=s.cooldown,
            links=self.links is not None,
        )

    async def test(self) -> list[ChannelResult]:
        """One test notification to every channel, one try each, concurrently."""
        status = self.machine.status()
        notice = Notice("test", self.sleeve_id, status.state, status.reason, url=self.dashboard)

        async def one(channel: Channel) -> ChannelResult:
            result = await channel.attempt(notice)
            channel.stats.record(result)
            return ChannelResult(channel=channel.name, ok=result.ok, detail=result.detail)

        return list(await asyncio.gather(*(one(c) for c in self.channels)))
