"""When a person is told, in-process: the real notifier on a real event bus, fed by the real agent
state machine and approval book, delivering to a loopback webhook receiver that verifies each
signature. The events are what the sources would report (a hook, the screen): the rules under
test only read the bus, so they are driven through it at the pace a test needs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.agent.approvals import Answer, Approval, Approvals
from sidecar.agent.machine import AgentMachine
from sidecar.config import Config, NotifyConfig
from sidecar.core.event_shapes import (
    ApprovalRequested,
    ApprovalResolved,
    CliExit,
    Event,
    NotificationEvent,
)
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.notify.service import Notifier
from tests.harness import wait_for_async
from tests.notifytools import WEBHOOK_SECRET, WebhookReceiver


class BudgetSpent(Event, tag="budget"):
    """A budget event as the budget feature publishes it (another part of the sidecar)."""

    message: str


class Rig:
    """The notifier as the supervisor wires it, with what it reads."""

    def __init__(self, receiver: WebhookReceiver, tmp: Path, **settings: Any) -> None:
        notify = NotifyConfig(
            webhook=receiver.url + "/hook", webhook_secret=WEBHOOK_SECRET, **settings
        )
        config = Config(sleeve_name="rules", cli="shell", state_dir=tmp, notify=notify)
        self.bus = EventBus()
        self.machine = AgentMachine(self.bus)
        self.approvals = Approvals(None, self._approval_changed)
        self.notifier = Notifier(config, self.bus, self.machine, self.approvals)
        self.receiver = receiver
        self.events: list[NotificationEvent] = []
        self.bus.listen(
            lambda e: self.events.append(e) if isinstance(e, NotificationEvent) else None
        )

    def _approval_changed(self, approval: Approval, answer: Answer | None) -> None:
        # As `sidecar.agent.awareness` publishes them.
        if answer is None and approval.withdrawn is None:
            self.bus.publish(
                ApprovalRequested(id=approval.id, tool=approval.tool, summary=approval.summary)
            )
        else:
            decision = answer.decision if answer else None
            by = answer.by if answer else None
            self.bus.publish(ApprovalResolved(id=approval.id, decision=decision, by=by))

    def running(self) -> None:
        self.machine.launched("hooks")
        self.machine.process_changed(ProcState.RUNNING)

    def bodies(self, event: str | None = None) -> list[dict[str, Any]]:
        return [b for b in self.receiver.bodies() if event is None or b["event"] == event]

    async def received(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            bodies = self.bodies()
            return bodies if len(bodies) >= count else None

        found = await wait_for_async(enough, timeout, what=f"{count} notifications")
        assert all(s.problems == [] for s in self.receiver.seen)
        return found


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver().start()
    yield hook
    hook.stop()


@pytest.fixture
async def rig_factory(receiver: WebhookReceiver, tmp_path: Path) -> AsyncIterator[Any]:
    made: list[Rig] = []

    def make(**settings: Any) -> Rig:
        rig = Rig(receiver, tmp_path, **settings)
        rig.notifier.start()
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.notifier.close()


async def test_a_request_answered_within_the_dwell_is_never_sent(rig_factory: Any) -> None:
    rig = rig_factory(dwell=0.3)
    rig.running()
    quick = rig.approvals.request("Bash", {"command": "ls"}, source="hooks")
    rig.machine.report("waiting", "Bash: ls")
    await asyncio.sleep(0.1)  # sleep-ok: a person answering within the dwell
    rig.approvals.answer(quick.id, Answer("allow", "terminal"))
    rig.machine.report("working")
    # The next request is left waiting: its notification comes after the first one's would have.
    slow = rig.approvals.request("Bash", {"command": "make"}, source="hooks")
    rig.machine.report("waiting", "Bash: make")
    (body,) = await rig.received(1)
    assert body["approval"]["id"] == slow.id and body["approval"]["summary"] == "make"
    assert [e.approval for e in rig.events if e.outcome == "sent"] == [slow.id]


async def test_a_thousand_flaps_within_the_cooldown_send_one_notification(
    rig_factory: Any,
) -> None:
    rig = rig_factory(dwell=0.001, cooldown=60.0)
    rig.running()
    for n in range(1000):
        rig.machine.report("waiting", f"dialog {n}")
        await asyncio.sleep(0.004)  # sleep-ok: each flap's `waiting` outlasts the 1 ms dwell
        rig.machine.report("working")
        await asyncio.sleep(0)  # sleep-ok: one loop turn between two flaps
    (body,) = await rig.received(1)
    assert body["event"] == "waiting" and body["agent"]["reason"] == "dialog 0"
    # Drained: a test notification goes straight out, after which nothing else came.
    assert [r.ok for r in await rig.notifier.test()] == [True]
    assert [b["event"] for b in rig.bodies()] == ["waiting", "test"]
    channel = rig.notifier.info().channels[0]
    assert (channel.sent, channel.failed) == (2, 0)
    assert channel.suppressed >= 900, channel.suppressed  # each later flap, held then dropped
    sent = [e for e in rig.events if e.outcome == "sent"]
    withdrawn = [e for e in rig.events if e.outcome == "withdrawn"]
    assert len(sent) == 1 and [e.id for e in withdrawn] == [sent[0].id]


async def test_the_cooldown_holds_a_request_and_sends_it_when_it_ends_if_still_open(
    rig_factory: Any,
) -> None:
    rig = rig_factory(dwell=0.0, cooldown=1.0)
    rig.running()
    first = rig.approvals.request("Bash", {"command": "one"}, source="hooks")
    (body,) = await rig.received(1)
    assert body["approval"]["id"] == first.id
    second = rig.approvals.request("Bash", {"command": "two"}, source="hooks")
    third = rig.approvals.request("Bash", {"command": "three"}, source="hooks")
    held = rig.notifier.rules._held  # their (zero) dwell over, both are held by the cooldown
    await wait_for_async(lambda: len(held.get("waiting", [])) == 2, 5, what="both held")
    rig.approvals.answer(third.id, Answer("deny", "api"))  # over before the cooldown ends
    bodies = await rig.received(2, timeout=5)
    assert [b["approval"]["id"] for b in bodies] == [first.id, second.id]
    assert any(e.outcome == "suppressed" and e.approval == third.id for e in rig.events)


async def test_typing_in_the_terminal_holds_back_all_but_permission_requests(
    rig_factory: Any,
) -> None:
    rig = rig_factory(dwell=0.0, on=frozenset({"waiting", "idle", "exited"}))
    rig.running()
    rig.notifier.presence.attached()
    rig.notifier.presence.typed()
    rig.machine.report("working")
    rig.machine.report("idle")
    rig.machine.report("waiting", "a trust dialog")  # a dialog, no request
    await wait_for_async(
        lambda: len([e for e in rig.events if e.why == "typing"]) == 2, 5, what="two held back"
    )
    request = rig.approvals.request("Bash", {"command": "rm -r build"}, source="hooks")
    (body,) = await rig.received(1)
    assert body["approval"]["id"] == request.id
    # Detached (the tab closed): told again.
    rig.notifier.presence.detached()
    rig.bus.publish(CliExit(cli="shell", exit_code=3, pid=1))
    rig.machine.process_changed(ProcState.EXITED)
    bodies = await rig.received(2)
    assert bodies[1]["event"] == "exited" and "code 3" in bodies[1]["agent"]["reason"]


async def test_events_other_parts_publish_notify_without_calling_the_notifier(
    rig_factory: Any,
) -> None:
    rig = rig_factory(on=frozenset({"budget"}))
    rig.bus.publish(BudgetSpent(message="80 % of the budget is spent"))
    (body,) = await rig.received(1)
    assert body["event"] == "budget" and body["agent"]["reason"] == "80 % of the budget is spent"


async def test_without_a_channel_nothing_listens_and_nothing_runs(tmp_path: Path) -> None:
    bus = EventBus()
    config = Config(sleeve_name="quiet", cli="shell", state_dir=tmp_path)
    notifier = Notifier(config, bus, AgentMachine(bus), Approvals(None, lambda a, b: None))
    notifier.start()
    assert notifier.channels == [] and notifier._workers == []
    assert bus._listeners == []
    assert notifier.info().channels == [] and not notifier.info().links
    await notifier.close()
