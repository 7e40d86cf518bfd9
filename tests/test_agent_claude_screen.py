"""The real Claude Code (2.1.330) as its screen shows it, against the API stub on loopback: the
trust dialog of a workspace it does not trust yet is `waiting` (no hook reports it), a permission
prompt dismissed with Escape is `idle` at once, and one answered for a tool that runs 5 s is
`working` while the tool runs. The first test's home is not configured to skip the dialog."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.agenttools import EventLog, claude_env, claude_sidecar, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_the_trust_dialog_is_waiting_refuses_a_prompt_and_its_answer_is_idle(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    sc = claude_sidecar(make_sidecar, stub_factory(), trusted=False).start()
    waiting = wait_agent(sc, "waiting")
    assert waiting["reason"] == (
        "Quick safety check: Is this a project you created or one you trust?"
    ), waiting
    code, body = sc.post("/input", {"text": "please run the tests"})
    assert code == 409, body
    assert "Quick safety check" in body["error"], body
    # "No, exit" is selected first: Down to "Yes, I trust this folder", then Enter.
    code, body = sc.post("/input", {"keys": ["Down", "Enter"]})
    assert code == 202, body
    wait_agent(sc, "idle")
    assert sc.status()["cli_running"]


def test_escape_on_a_permission_prompt_is_idle_within_3_s(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    sc = claude_sidecar(make_sidecar, stub_factory(bash_command="touch never.txt")).start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]})[0] == 202
    assert "touch never.txt" in wait_agent(sc, "waiting")["reason"]
    code, body = sc.post("/input", {"keys": ["Escape"], "if_state": ["waiting"]})
    assert code == 202, body
    sent = time.monotonic()
    wait_agent(sc, "idle", timeout=3)
    assert time.monotonic() - sent < 3
    assert not (sc.workspace / "never.txt").exists()
    events.wait_states(["waiting", "idle"])


def test_an_answered_prompt_is_working_while_its_5_s_tool_runs(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    stub = stub_factory(bash_command="sleep 5; touch slept.txt")
    sc = claude_sidecar(make_sidecar, stub).start()
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]})[0] == 202
    wait_agent(sc, "waiting")
    code, body = sc.post("/input", {"keys": ["Enter"], "if_state": ["waiting"]})
    assert code == 202, body
    answered = time.monotonic()
    wait_agent(sc, "working", timeout=1)
    assert time.monotonic() - answered < 1
    # Still running its tool: not back to `waiting` (the tool's PostToolUse has not come).
    assert not (sc.workspace / "slept.txt").exists()
    assert sc.status()["agent"]["state"] == "working"
    wait_agent(sc, "idle", timeout=30)
    assert (sc.workspace / "slept.txt").exists()


def test_a_fresh_home_is_never_idle(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """Nothing configured away: no ~/.claude.json at all, as on a user's new machine. Offline,
    Claude Code 2.1.330's first start checks its sign-in service, cannot reach it, says so and
    exits: the state is `exited` (never `idle`), the screen keeps what it said, and a prompt is
    refused rather than typed anywhere."""
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub_factory()))
    (sc.tmp / "home" / ".claude.json").unlink()
    sc.start(wait_healthy=False)
    events = EventLog(sc)
    # The agent is `exited` before the first launch too (the CLI is not running yet): what
    # ends the wait is the CLI's own exit.
    gone = sc.wait_status(lambda s: s["cli_state"] == "exited", "the CLI's exit", timeout=30)
    assert gone["agent"]["state"] == "exited", gone["agent"]
    code, screen = sc.get("/screen")
    assert code == 200, screen
    assert any("Unable to connect to Anthropic services" in line for line in screen["lines"])
    code, body = sc.post("/input", {"text": "please run the tests"})
    assert code == 409, body
    assert "idle" not in [e["state"] for e in events.of("agent-state")]
