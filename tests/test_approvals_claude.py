"""Approvals with the real Claude Code (2.1.330) against the API stub on loopback: its
PermissionRequest hook is held until the API answers (the command runs, or does not and the model
hears the message), a person in the terminal answers first (the API gets 409 `by: terminal`), the
timeout policy denies, and a supervisor crash while a request waits never decides it twice."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.agenttools import asking, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, wait_for
from tests.proctools import kill_supervisor, restarted

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_allowed_through_the_api_the_command_runs(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    stub = stub_factory(bash_command="touch allowed.txt")
    sc, events, requested = asking(make_sidecar, stub)
    assert requested["tool"] == "Bash" and requested["summary"] == "touch allowed.txt"
    listed = sc.get("/approvals").body["approvals"]
    assert [a["id"] for a in listed] == [requested["id"]]
    assert listed[0]["input"]["command"] == "touch allowed.txt"
    assert listed[0]["source"] == "hooks"
    # At once: the hook is held, so nothing has to wait for the dialog to be drawn.
    reply = sc.post(f"/approvals/{requested['id']}", {"decision": "allow"})
    assert reply.status == 200, reply.body
    assert reply.body == {"id": requested["id"], "decision": "allow", "by": "api"}
    wait_for(lambda: (sc.workspace / "allowed.txt").exists(), 15, what="the command ran")
    wait_agent(sc, "idle")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["decision"], resolved["by"]) == ("allow", "api")
    assert sc.get("/approvals").body["approvals"] == []
    again = sc.post(f"/approvals/{requested['id']}", {"decision": "deny"})
    assert again.status == 409 and (again.body["decision"], again.body["by"]) == ("allow", "api")
    metrics = sc.get("/metrics").body.decode()
    assert 'sidecar_approvals_decided_total{decision="allow",by="api"} 1' in metrics
    assert "sidecar_approvals_pending 0" in metrics


def test_denied_with_a_message_the_command_does_not_run_and_the_model_hears_why(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    stub = stub_factory(bash_command="touch denied.txt")
    sc, _, requested = asking(make_sidecar, stub)
    why = "Not on this branch: open a pull request instead."
    reply = sc.post(f"/approvals/{requested['id']}", {"decision": "deny", "message": why})
    assert reply.status == 200, reply.body
    wait_for(lambda: any(why in r for r in stub.tool_results()), 15, what="the deny message")
    assert not (sc.workspace / "denied.txt").exists()


def test_the_terminal_answers_first_and_the_api_is_told_so(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    stub = stub_factory(bash_command="touch by-hand.txt")
    sc, events, requested = asking(make_sidecar, stub)
    # A person at the terminal: the key goes to the pane as typed (held until the dialog takes
    # it), not through the approval.
    assert sc.post("/input", {"keys": ["Enter"], "if_state": ["waiting"]}).status == 202
    wait_for(lambda: (sc.workspace / "by-hand.txt").exists(), 15, what="the command ran")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["decision"], resolved["by"]) == ("allow", "terminal")
    late = sc.post(f"/approvals/{requested['id']}", {"decision": "deny"})
    assert late.status == 409, late.body
    assert (late.body["decision"], late.body["by"]) == ("allow", "terminal")
    wait_agent(sc, "idle")
    assert (sc.workspace / "by-hand.txt").exists()


def test_nobody_answers_and_the_timeout_denies(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    stub = stub_factory(bash_command="touch timed-out.txt")
    sc, events, requested = asking(make_sidecar, stub, SIDECAR_APPROVAL_TIMEOUT="2")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "the timeout", 15)
    assert (resolved["id"], resolved["decision"], resolved["by"]) == (
        requested["id"],
        "deny",
        "timeout",
    )
    wait_for(
        lambda: any("SIDECAR_APPROVAL_TIMEOUT" in r for r in stub.tool_results()),
        15,
        what="the model told why",
    )
    wait_agent(sc, "idle")
    assert not (sc.workspace / "timed-out.txt").exists()
    assert "approval " + requested["id"] + " deny by timeout" in sc.log()


def test_a_supervisor_crash_while_a_request_waits_lists_it_again_and_decides_it_once(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """The held hook dies with the supervisor: Claude Code keeps its dialog for the person.
    The next supervisor reads the dialog on screen and lists it again under a new id, answered
    with the dialog's keys."""
    stub = stub_factory(bash_command="touch after-crash.txt")
    sc, _, requested = asking(make_sidecar, stub)
    kill_supervisor(sc)
    restarted(sc, 1)
    relisted = wait_for(
        lambda: sc.get("/approvals").body["approvals"], 20, what="the request listed again"
    )
    assert len(relisted) == 1 and relisted[0]["source"] == "screen", relisted
    assert relisted[0]["id"] != requested["id"]
    assert "touch after-crash.txt" in relisted[0]["summary"]
    assert sc.post(f"/approvals/{requested['id']}", {"decision": "allow"}).status == 404
    started = time.monotonic()
    reply = sc.post(f"/approvals/{relisted[0]['id']}", {"decision": "allow"})
    assert reply.status == 200, reply.body
    wait_for(lambda: (sc.workspace / "after-crash.txt").exists(), 15, what="the command ran")
    assert time.monotonic() - started < 15
    wait_agent(sc, "idle")
    assert sc.get("/approvals").body["approvals"] == []
