"""What the sidecar knows about Gemini CLI, without running it: its hook events, the keys for its
confirmation, our settings document and which conversation a start resumes (files shaped as
Gemini 0.61 writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.agent import hook_relay
from sidecar.agent.clis import gemini_cli
from sidecar.agent.clis.gemini_cli import hooks
from sidecar.agent.hooks import HookEffect
from sidecar.agent.registry import load_registry
from sidecar.config import ConfigError

SESSION = "3f4e3873-1575-49ef-b81d-222c6ae9216f"
CONTEXT = {"type": "user", "content": [{"text": "<session_context>\nThis is the Gemini CLI."}]}


def test_events_say_the_state_and_the_session() -> None:
    interpret = hooks.interpret
    start = interpret("SessionStart", {"session_id": SESSION, "source": "startup"})
    assert (start.state, start.session_id) == (None, SESSION)
    assert interpret("BeforeAgent", {"session_id": "not-a-uuid"}) == HookEffect("working")
    asks = {
        "notification_type": "ToolPermission",
        "message": "Tool Confirm Shell Command requires execution",
        "details": {"type": "exec", "title": "Confirm Shell Command", "command": "rm -rf b\n"},
    }
    assert interpret("Notification", asks) == HookEffect(
        "waiting", "Shell: rm -rf b", restates=True
    )
    edit = {"notification_type": "ToolPermission", "details": {"type": "edit", "filePath": "/a"}}
    assert interpret("Notification", edit).reason == "Edit: /a"
    odd = {"notification_type": "ToolPermission", "details": [], "message": "Tool X"}
    assert interpret("Notification", odd).reason == "Tool X"
    assert interpret("Notification", {"notification_type": "Other"}).state is None
    assert interpret("AfterTool", {}).state == "working"
    assert interpret("AfterAgent", {}).state == "idle"
    assert interpret("SessionEnd", {}).state is None


def test_approval_keys_pick_the_confirmation_s_choices() -> None:
    keys = gemini_cli.CLI.screen.keys
    assert keys("allow", False) == ("1",)
    assert keys("allow", True) == ("2",)
    assert keys("deny", False) == ("3",)
    assert keys("deny", True) == ("3",)


def test_settings_add_our_relay_to_an_administrator_s_defaults(tmp_path: Path) -> None:
    mine = {"hooks": {"AfterAgent": [{"hooks": [{"type": "command", "command": "theirs"}]}]}}
    admin = {**mine, "ui": {"theme": "x"}}
    ours = tmp_path / "ours.json"
    document = hooks.settings("http://127.0.0.1:1/hooks/gemini-cli/", "s3", ours, admin)
    assert document["ui"] == {"theme": "x"}
    after = document["hooks"]["AfterAgent"]
    assert after[0]["hooks"][0]["command"] == "theirs"
    assert after[1]["hooks"][0]["command"] == hook_relay.command(ours, "AfterAgent")
    assert set(document["hooks"]) == set(hooks.EVENTS)
    # The relay finds the route and the secret in it.
    assert hook_relay._target(document) == (
        "http://127.0.0.1:1/hooks/gemini-cli/",
        {"X-Sidecar-Hook": "s3"},
    )
    assert admin == {**mine, "ui": {"theme": "x"}}  # not changed in place


def test_system_defaults_follow_gemini_s_variables() -> None:
    assert hooks.system_defaults({}) == Path("/etc/gemini-cli/system-defaults.json")
    assert hooks.system_defaults({"GEMINI_CLI_SYSTEM_SETTINGS_PATH": "/o/s.json"}) == Path(
        "/o/system-defaults.json"
    )
    given = {"GEMINI_CLI_SYSTEM_DEFAULTS_PATH": "/d.json"}
    assert hooks.system_defaults(given) == Path("/d.json")


def test_ci_markers_that_make_gemini_headless_become_1() -> None:
    """Gemini 0.61 drops its terminal UI when CI or GITHUB_ACTIONS is exactly "true"."""
    env = {"CI": "true", "GITHUB_ACTIONS": "true", "CI_JOB": "true", "HOME": "/h"}
    assert hooks.interactive_env(env) == {"CI": "1", "GITHUB_ACTIONS": "1"}
    for kept in ({}, {"CI": "1"}, {"CI": "True"}, {"CI": "false"}, {"GITHUB_ACTIONS": ""}):
        assert hooks.interactive_env(kept) == {}


def _conversation(home: Path, workspace: Path, name: str, lines: list[object]) -> None:
    gemini = home / ".gemini"
    chats = gemini / "tmp" / "ws" / "chats"
    chats.mkdir(parents=True, exist_ok=True)
    (gemini / "projects.json").write_text(json.dumps({"projects": {str(workspace): "ws"}}))
    (chats / name).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_pinned_conversation_is_resumed_only_when_gemini_would(tmp_path: Path) -> None:
    gemini, ws = tmp_path / ".gemini", tmp_path / "ws"
    args = hooks.session_args
    assert args(SESSION, gemini, ws) == (("--session-id", SESSION), SESSION)
    header = {"sessionId": SESSION, "startTime": "t", "kind": "main"}
    name = f"session-2026-11-24T18-45-{SESSION[:8]}.jsonl"
    # Written at start, nothing said yet: Gemini neither resumes nor takes the id again.
    _conversation(tmp_path, ws, name, [header, {"$set": {"messages": [CONTEXT]}}])
    fresh, pinned = args(SESSION, gemini, ws)
    assert fresh[0] == "--session-id" and pinned != SESSION and fresh[1] == pinned
    prompt = {"id": "1", "type": "user", "content": [{"text": "remember this"}]}
    _conversation(tmp_path, ws, name, [header, {"$set": {"messages": [CONTEXT]}}, prompt])
    assert args(SESSION, gemini, ws) == (("--resume", SESSION), SESSION)
    # Resumed within the minute its file is named after: started over in the same file.
    lines = [header, {"$set": {"messages": [CONTEXT]}}, prompt, header]
    _conversation(tmp_path, ws, name, [*lines, {"$set": {"messages": [CONTEXT]}}])
    assert args(SESSION, gemini, ws)[0][0] == "--session-id"
    # A resume in a later minute starts another file; the first still holds the conversation.
    _conversation(tmp_path, ws, name, [header, prompt])
    later = f"session-2026-11-24T18-46-{SESSION[:8]}.jsonl"
    _conversation(tmp_path, ws, later, [header, {"$set": {"messages": [CONTEXT]}}])
    assert args(SESSION, gemini, ws) == (("--resume", SESSION), SESSION)
    # No pinned id: the workspace's latest conversation, when it has one.
    assert args(None, gemini, ws) == (("--resume", "latest"), None)
    assert args(None, gemini, tmp_path / "other")[0][0] == "--session-id"


def test_state_hooks_is_for_the_clis_whose_hooks_the_sidecar_knows(tmp_path: Path) -> None:
    assert load_registry(None)["gemini-cli"].state == "hooks"
    path = tmp_path / "clis.yaml"
    path.write_text("clis:\n  mine:\n    command: [/opt/gemini]\n    state: hooks\n")
    mine = load_registry(path)["mine"]
    assert (mine.state, mine.knowledge) == ("hooks", gemini_cli.CLI)
    path.write_text("clis:\n  mine:\n    command: [/opt/other]\n    state: hooks\n")
    with pytest.raises(ConfigError, match="state: hooks needs a CLI whose hooks it knows"):
        load_registry(path)
