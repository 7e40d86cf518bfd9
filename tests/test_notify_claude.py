"""Notifications with the real Claude Code (2.1.330) against the API stub on loopback: its
permission prompt reaches a loopback webhook receiver once the dwell is over, carrying Allow and
Deny links; the Allow link's POST lets the tool run, and the Deny link afterwards is a 409. A
prompt a person answers in the terminal within the dwell is never sent."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.agenttools import EventLog, asking, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, http, wait_for
from tests.notifytools import WebhookReceiver, public, webhook_env

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver().start()
    yield hook
    hook.stop()


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def notifying(
    make_sidecar: Callable[..., Sidecar],
    stub: AnthropicStub,
    receiver: WebhookReceiver,
    tmp: Path,
    dwell: float,
) -> tuple[Sidecar, EventLog, dict[str, object]]:
    """Claude Code asked to run the stub's command, with a webhook for `waiting` and `idle`."""
    env = webhook_env(
        tmp, receiver, SIDECAR_NOTIFY_DWELL=str(dwell), SIDECAR_NOTIFY_ON="waiting,idle"
    )
    return asking(public(make_sidecar), stub, **env)


def test_a_permission_prompt_is_sent_after_the_dwell_and_its_allow_link_runs_the_tool(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    receiver: WebhookReceiver,
    short_tmp: Path,
) -> None:
    dwell = 1.0
    stub = stub_factory(bash_command="touch by-link.txt")
    sc, events, requested = notifying(make_sidecar, stub, receiver, short_tmp, dwell)
    (seen,) = receiver.wait(1, 10, what="the notification")
    assert seen.problems == []
    late = seen.wall - epoch(str(requested["time"]))
    assert dwell <= late + 0.05 and late <= dwell + 0.5, late
    body = seen.payload
    assert body["event"] == "waiting" and body["approval"]["id"] == requested["id"]
    assert (body["approval"]["tool"], body["approval"]["summary"]) == ("Bash", "touch by-link.txt")
    assert body["agent"]["state"] == "waiting"
    allow, deny = body["approval"]["actions"]["allow"], body["approval"]["actions"]["deny"]

    reply = http("POST", allow)
    assert reply.status == 200 and reply.body["by"] == "link", reply.body
    wait_for(lambda: (sc.workspace / "by-link.txt").exists(), 15, what="the tool ran")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["decision"], resolved["by"]) == ("allow", "link")
    refused = http("POST", deny)
    assert refused.status == 409 and (refused.body["decision"], refused.body["by"]) == (
        "allow",
        "link",
    )
    wait_agent(sc, "idle")
    # The turn's end is told too (SIDECAR_NOTIFY_ON has idle); the request's notification was
    # withdrawn on /events when it was answered.
    bodies = [s.payload for s in receiver.wait(2, 15, what="the idle notification")]
    assert [b["event"] for b in bodies] == ["waiting", "idle"]
    notes = events.of("notification")
    assert [(n["outcome"], n["event"]) for n in notes[:2]] == [
        ("sent", "waiting"),
        ("withdrawn", "waiting"),
    ]


def test_a_prompt_answered_in_the_terminal_within_the_dwell_is_never_sent(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    receiver: WebhookReceiver,
    short_tmp: Path,
) -> None:
    dwell = 4.0
    stub = stub_factory(bash_command="touch by-hand.txt")
    sc, events, requested = notifying(make_sidecar, stub, receiver, short_tmp, dwell)
    # A person at the terminal answers it (the key is held until the dialog takes it).
    assert sc.post("/input", {"keys": ["Enter"], "if_state": ["waiting"]}).status == 202
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert resolved["by"] == "terminal"
    assert epoch(str(resolved["time"])) - epoch(str(requested["time"])) < dwell
    wait_for(lambda: (sc.workspace / "by-hand.txt").exists(), 15, what="the tool ran")
    wait_agent(sc, "idle")
    (idle,) = receiver.wait(1, 15, what="the turn's end")
    assert idle.payload["event"] == "idle"
    # Past the dwell, nothing more came: the prompt that was answered in time was never sent.
    left = epoch(str(requested["time"])) + dwell + 1 - time.time()
    if left > 0:
        time.sleep(left)  # sleep-ok: proving that nothing arrives once the dwell is over
    assert [s.payload["event"] for s in receiver.seen] == ["idle"]
    assert [n["event"] for n in events.of("notification")] == ["idle"]
