"""Agent state, approvals and resume with the real Codex CLI (0.169.0) in real tmux, talking to
the loopback Responses API stub (the network seam: no real API is reachable here). The stub
answers a prompt with an `exec_command` call that needs approval; the approval comes through
Codex's PermissionRequest hook, held by the sidecar until `POST /approvals/{id}` answers it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.agenttools import EventLog, agent_status, cli_argv, wait_agent
from tests.clitools import RAN, codex_sidecar, rollout, tool_stub  # tool_stub: a fixture
from tests.harness import Sidecar, http, wait_for

__all__ = ["tool_stub"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "codex-admin-token-0123456789"
HOOK = "/hooks/codex"


def prompt_until_waiting(sc: Sidecar, text: str) -> dict:
    code, body = sc.post("/input", {"text": text, "if_state": ["idle"]})
    assert code == 202 and body["delivered"] is True, body
    waiting = wait_agent(sc, "waiting", 60)
    assert "Bash" in waiting["reason"] and RAN in waiting["reason"], waiting
    code, body = sc.get("/approvals")
    assert code == 200 and len(body["approvals"]) == 1, body
    approval = body["approvals"][0]
    assert approval["source"] == "hooks" and RAN in approval["summary"], approval
    return dict(approval)


def test_prompt_approval_deny_and_resume_with_the_real_codex(
    make_sidecar: Callable[..., Sidecar], tool_stub: str
) -> None:
    """idle -> prompt via /input -> working -> waiting (the command) -> allowed via /approvals
    -> the command ran -> idle, in that order on /events; then a deny with a message (told to
    the model, the command not run) and an inbox notice typed once the prompt is back, not
    over the approval; hook calls with a wrong secret change nothing; the user's
    own hook ran beside ours and their config was not written; a resleeve and a restart resume
    the same conversation (`codex resume <id>`)."""
    sc = codex_sidecar(make_sidecar, tool_stub, SIDECAR_TOKEN=TOKEN).start()
    config_before = (sc.tmp / "home" / ".codex" / "config.toml").read_text()
    events = EventLog(sc, TOKEN)
    assert wait_agent(sc, "idle", 60)["source"] == "hooks"

    approval = prompt_until_waiting(sc, "please run the command")
    session = agent_status(sc)["session_id"]
    assert session and len(session) == 36
    code, body = sc.post(f"/approvals/{approval['id']}", {"decision": "allow"})
    assert code == 200 and body["by"] == "api", body
    wait_agent(sc, "idle", 60)
    assert (sc.workspace / "ran.txt").read_text() == "CODEX-RAN\n"
    events.wait_states(["idle", "working", "waiting", "working", "idle"])
    waits = [e for e in events.of("agent-state") if e["state"] == "waiting"]
    assert waits[0]["previous"] == "working" and RAN in waits[0]["reason"]
    resolved = events.wait(lambda e: e.get("type") == "approval-resolved", "resolved")
    assert (resolved["decision"], resolved["by"]) == ("allow", "api")

    # A forged hook: refused, nothing listed, the state untouched.
    payload = {"session_id": session, "tool_name": "Bash", "tool_input": {"command": "rm -rf /"}}
    for headers in ({}, {"X-Sidecar-Hook": "wrong"}):
        code, _ = http(
            "POST", f"{sc.url}{HOOK}/PermissionRequest", headers=headers,
            raw=json.dumps(payload).encode(),
        )  # fmt: skip
        assert code == 403
    assert sc.get("/approvals")[1]["approvals"] == []
    assert agent_status(sc)["state"] == "idle"

    (sc.workspace / "ran.txt").unlink()
    approval = prompt_until_waiting(sc, "run it once more")
    # An inbox message while Codex waits: its notice is typed only once the prompt is back.
    code, body = sc.post("/inbox", {"from": "envoy", "type": "task", "content": "INBOX-NOTE"})
    assert code == 201, body
    assert events.of("inbox-notified") == []
    code, body = sc.post(
        f"/approvals/{approval['id']}", {"decision": "deny", "message": "NOT-NOW-PLEASE"}
    )
    assert code == 200, body
    mark = len(events.states())
    events.wait(lambda e: e.get("type") == "inbox-notified", "the inbox notice", 60)
    # The notice started a turn at the prompt (the stub asks for its command again).
    events.wait_states([*events.states()[:mark], "idle", "working", "waiting"], 60)
    assert not (sc.workspace / "ran.txt").exists()
    wait_for(lambda: "NOT-NOW-PLEASE" in rollout(sc, session), 10, what="the deny's message")
    assert (sc.tmp / "user-hook.txt").read_text().count("user-hook") == 3
    # Codex writes its own notes there; none of ours (hooks, their trust) went in.
    config_after = (sc.tmp / "home" / ".codex" / "config.toml").read_text()
    assert config_after.startswith(config_before)
    assert "hook_relay" not in config_after and "session-flags" not in config_after
    ours = sc.state_dir / "codex-hooks.json"
    assert ours.stat().st_mode & 0o777 == 0o600
    assert not any(json.loads(ours.read_text())["hooks"]["Stop"][0]["hooks"][0]["headers"]
                   ["X-Sidecar-Hook"] in arg for arg in cli_argv(sc))  # fmt: skip

    code, body = sc.post("/resleeve", {})
    assert code == 202, body
    sc.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved")
    assert wait_agent(sc, "idle", 60)["session_id"] == session
    argv = cli_argv(sc)
    assert argv[argv.index("resume") + 1] == session
    assert sc.stop() == 0
    sc.start()
    assert wait_agent(sc, "idle", 60)["session_id"] == session
    argv = cli_argv(sc)
    assert argv[argv.index("resume") + 1] == session


def test_fresh_codex_with_nothing_configured_reads_as_waiting(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """No config, no API key: Codex's first-start screens (sign-in) need a person: `waiting`,
    never `idle` once drawn. (Before it Codex draws its whole composer for ~0.1 s, the very
    frame a configured start shows: a look that lands on it reads the prompt.)"""
    sc = codex_sidecar(make_sidecar, None).start()
    events = EventLog(sc)
    first = wait_agent(sc, "waiting", 60)
    assert first["source"] == "hooks" and first["reason"], first
    # Its sign-in screen animates forever: still waiting once the whole of it is drawn.
    wait_for(
        lambda: any("Sign in with ChatGPT" in line for line in sc.get("/screen")[1]["lines"]),
        30,
        what="the sign-in screen",
    )
    assert agent_status(sc)["state"] == "waiting"
    states = events.wait_states(["waiting"])  # its reader thread may be behind /status
    assert "idle" not in states[states.index("waiting") :], states


def test_codex_whose_hooks_never_report_falls_back_to_screen_and_activity(
    make_sidecar: Callable[..., Sidecar], tool_stub: str
) -> None:
    """Hooks turned off in the user's config (`[features] hooks = false`): Codex runs none of
    ours. The sidecar notices (a turn at work, no hook), says so in /status and reads the agent
    from the screen and the pane: its approval dialog is `waiting`, naming the command, and
    keys answer it."""
    sc = codex_sidecar(make_sidecar, tool_stub, extra="[features]\nhooks = false\n").start()
    wait_agent(sc, "idle", 60)
    assert sc.post("/input", {"text": "please run the command"})[0] == 202
    waiting = wait_agent(sc, "waiting", 60)
    assert RAN in waiting["reason"], waiting
    found = sc.wait_status(
        lambda s: any("no hook reported" in w for w in s["warnings"]), "the warning", 30
    )
    assert found["agent"]["source"] == "activity"
    assert found["agent"]["state"] == "waiting"
    # No hook holds it: the dialog is listed from the screen and answered with Codex's keys.
    listed = wait_for(lambda: sc.get("/approvals")[1]["approvals"], 15, what="listed")
    assert listed[0]["source"] == "screen" and RAN in listed[0]["summary"], listed
    code, body = sc.post(f"/approvals/{listed[0]['id']}", {"decision": "allow"})
    assert code == 200, body
    wait_for(lambda: (sc.workspace / "ran.txt").exists(), 30, what="the command ran")
    wait_agent(sc, "idle", 60)
