"""Agent state with the real Claude Code CLI (2.1.330) in real tmux, talking to the loopback API
stub (the network seam: no real API is reachable here). The stub answers the prompt with a Bash
`tool_use`, so the CLI asks permission; the answer comes through `POST /input`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.agenttools import (
    EventLog,
    agent_status,
    claude_sidecar,
    cli_argv,
    stub_factory,
    wait_agent,
)
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, http, wait_for

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOKEN = "agent-admin-token-0123456789"
HOOK = "/hooks/claude-code"


def test_prompt_permission_answer_and_idle_with_the_real_claude_code(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """idle -> prompt via /input -> working -> waiting (Bash and its command) -> keys via
    /input -> working -> idle; the command ran; /events has the sequence; the user's own hook
    in ~/.claude/settings.json still ran beside ours."""
    marker_cmd = "echo AGENT-STATE-RAN | tee ran.txt"
    stub = stub_factory(bash_command=marker_cmd)
    # With an API token: the hooks reach the sidecar without it (the CLI never has it).
    sc = claude_sidecar(make_sidecar, stub, SIDECAR_TOKEN=TOKEN).start()
    events = EventLog(sc, TOKEN)
    first = wait_agent(sc, "idle")
    assert first["source"] == "hooks"
    session = first["session_id"]
    assert session and len(session) == 36

    code, body = sc.post("/input", {"text": "please run the command", "if_state": ["idle"]})
    assert code == 202 and body["delivered"] is True, body
    waiting = wait_agent(sc, "waiting")
    assert "Bash" in waiting["reason"] and marker_cmd in waiting["reason"], waiting
    assert sc.get("/health")[1]["agent"] == "waiting"

    # Sent at once: the sidecar holds the key until the prompt can take it, then confirms.
    code, body = sc.post("/input", {"keys": ["Enter"], "if_state": ["waiting"]})
    assert code == 202, body
    assert body["changed"] is True and body["agent"] != "waiting", body
    assert body["held"] > 0
    wait_agent(sc, "idle")
    assert (sc.workspace / "ran.txt").read_text() == "AGENT-STATE-RAN\n"
    # The CLI sent the command's output back to the model, and the turn ended with its answer.
    assert any("AGENT-STATE-RAN" in r for r in stub.tool_results()), stub.tool_results()
    events.wait_states(["idle", "working", "waiting", "working", "idle"])
    waits = [e for e in events.of("agent-state") if e["state"] == "waiting"]
    assert waits[0]["previous"] == "working" and marker_cmd in waits[0]["reason"]
    assert (sc.tmp / "user-hook.txt").read_text().count("user-hook") == 1
    # The user's settings file was not written to.
    settings = json.loads((sc.tmp / "home" / ".claude" / "settings.json").read_text())
    assert list(settings["hooks"]) == ["UserPromptSubmit"]
    # The hook settings file is ours, in the state dir, readable by its owner only.
    ours = sc.state_dir / "claude-code-hooks.json"
    assert ours.stat().st_mode & 0o777 == 0o600
    assert agent_status(sc)["session_id"] == session


def test_resleeve_and_restart_resume_the_same_session_id(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """The pinned --session-id is resumed (--resume <id>) after a resleeve, after a resleeve
    to another CLI and back, and after the sidecar itself was stopped and started again."""
    stub = stub_factory()
    sc = claude_sidecar(make_sidecar, stub).start()
    session = wait_agent(sc, "idle")["session_id"]
    assert cli_argv(sc)[-2:] == ["--session-id", session]
    assert sc.post("/input", {"text": "remember this"})[0] == 202
    wait_for(lambda: any("remember this" in p for p in stub.prompts_seen()), 30, what="prompt")
    wait_agent(sc, "idle")

    def resumed(cli: str = "claude-code") -> None:
        code, body = sc.post("/resleeve", {"cli": cli})
        assert code == 202, body
        sc.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved")

    resumed()
    assert wait_agent(sc, "idle")["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]
    resumed("shell")
    assert agent_status(sc)["source"] == "activity"
    resumed()
    assert wait_agent(sc, "idle")["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]

    assert sc.stop() == 0
    sc.start()
    assert wait_agent(sc, "idle")["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]


def test_forged_malformed_and_stale_hook_calls_change_nothing(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """Wrong or missing secret, a 1 MiB body, not JSON, an unknown event: refused, the state
    and the event stream untouched; after a resleeve the old CLI's secret is refused."""
    sc = claude_sidecar(make_sidecar, stub_factory(), SIDECAR_TOKEN=TOKEN).start()
    wait_agent(sc, "idle")
    events = EventLog(sc, TOKEN)
    settings = json.loads((sc.state_dir / "claude-code-hooks.json").read_text())
    hook = settings["hooks"]["PermissionRequest"][0]["hooks"][0]
    secret = hook["headers"]["X-Sidecar-Hook"]
    assert hook["url"].startswith("http://127.0.0.1:")
    payload = {"tool_name": "Bash", "tool_input": {"command": "rm -rf /"}}
    bad = [
        ({}, json.dumps(payload).encode(), "PermissionRequest"),
        ({"X-Sidecar-Hook": "wrong"}, json.dumps(payload).encode(), "PermissionRequest"),
        ({"X-Sidecar-Hook": secret[:-1]}, json.dumps(payload).encode(), "PermissionRequest"),
        ({"X-Sidecar-Hook": "wrong"}, b"x" * (1024 * 1024), "PermissionRequest"),
        ({"X-Sidecar-Hook": secret}, b"{not json", "PermissionRequest"),
        ({"X-Sidecar-Hook": secret}, b"[1, 2]", "Stop"),
        ({"X-Sidecar-Hook": secret}, json.dumps(payload).encode(), "NoSuchEvent"),
    ]
    for headers, raw, event in bad:
        code, body = http("POST", f"{sc.url}{HOOK}/{event}", headers=headers, raw=raw)
        assert code in (400, 403), (event, code, body)
        assert "error" in body
    assert agent_status(sc)["state"] == "idle"
    assert events.of("agent-state") == []
    # The API token is no hook secret either.
    code, _ = http(
        "POST", f"{sc.url}{HOOK}/PermissionRequest", headers={"Authorization": f"Bearer {TOKEN}"},
        raw=json.dumps(payload).encode(),
    )  # fmt: skip
    assert code == 403
    code, body = sc.post("/resleeve", {})
    assert code == 202, body
    sc.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved")
    wait_agent(sc, "idle")
    events.wait_states(["starting", "idle"])  # read by then, so none comes after the mark
    mark = len(events.of("agent-state"))
    code, _ = http(
        "POST", f"{sc.url}{HOOK}/PermissionRequest", headers={"X-Sidecar-Hook": secret},
        raw=json.dumps(payload).encode(),
    )  # fmt: skip
    assert code == 403
    assert agent_status(sc)["state"] == "idle"
    assert events.of("agent-state")[mark:] == []
