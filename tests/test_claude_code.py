"""What Claude Code's hook events mean for the agent (`claude_code.interpret`, pure), and where
Claude Code keeps a workspace's conversations. No CLI runs here: test_agent_claude.py drives the
real one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.agent.clis.claude_code import hooks as claude_code
from sidecar.agent.clis.claude_code.hooks import (
    EVENTS,
    config_dir,
    interpret,
    project_dir,
    session_args,
    transcript,
)
from sidecar.agent.hooks import HookEffect

SESSION = "0b8e4c0e-5f6a-4d8e-9c1b-2a3b4c5d6e7f"


@pytest.mark.parametrize(
    ("event", "payload", "effect"),
    [
        ("SessionStart", {"source": "startup"}, HookEffect("idle")),
        (
            "SessionStart",
            {"source": "resume", "session_id": SESSION},
            HookEffect("idle", None, SESSION),
        ),
        # A compaction mid-turn starts a "session" too, and changes nothing.
        (
            "SessionStart",
            {"source": "compact", "session_id": SESSION},
            HookEffect(None, None, SESSION),
        ),
        ("UserPromptSubmit", {"session_id": SESSION}, HookEffect("working", None, SESSION)),
        ("PreToolUse", {"tool_name": "Bash"}, HookEffect("working")),
        ("PostToolUse", {"tool_name": "Bash"}, HookEffect("working")),
        ("PostToolUseFailure", {"tool_name": "Edit"}, HookEffect("working")),
        ("PermissionDenied", {"tool_name": "Bash"}, HookEffect("working")),
        (
            "PreToolUse",
            {
                "tool_name": "AskUserQuestion",
                "tool_input": {"questions": [{"question": "Which\nbranch?"}, {"question": "x"}]},
            },
            HookEffect("waiting", "question: Which branch?"),
        ),
        (
            "PermissionRequest",
            {"tool_name": "Bash", "tool_input": {"command": "rm -rf build", "path": "/x"}},
            HookEffect("waiting", "permission for Bash: rm -rf build"),
        ),
        (
            "PermissionRequest",
            {"tool_name": "Write", "tool_input": {"command": "  ", "file_path": "a.py"}},
            HookEffect("waiting", "permission for Write: a.py"),
        ),
        (
            "PermissionRequest",
            {"tool_name": "WebFetch"},
            HookEffect("waiting", "permission for WebFetch"),
        ),
        (
            "Notification",
            {"notification_type": "permission_prompt", "message": "Claude needs\tyour permission"},
            HookEffect("waiting", "Claude needs your permission", restates=True),
        ),
        (
            "Notification",
            {"notification_type": "elicitation_dialog", "message": "Pick one"},
            HookEffect("waiting", "Pick one", restates=True),
        ),
        (
            "Notification",
            {"notification_type": "idle_prompt", "message": "waiting"},
            HookEffect("idle"),
        ),
        ("Notification", {"notification_type": "auth_success"}, HookEffect(None)),
        ("Stop", {"session_id": SESSION}, HookEffect("idle")),
        ("StopFailure", {}, HookEffect("idle", "the turn ended with an API error")),
        ("SessionEnd", {"reason": "exit"}, HookEffect(None)),
        ("NoSuchEvent", {"session_id": SESSION}, HookEffect(None)),
    ],
)
def test_each_hook_event_maps_to_its_effect(
    event: str, payload: dict[str, Any], effect: HookEffect
) -> None:
    assert interpret(event, payload) == effect


@pytest.mark.parametrize(
    ("event", "payload", "effect"),
    [
        # Anything that is not a lowercase UUID is no session id.
        ("UserPromptSubmit", {"session_id": SESSION.upper()}, HookEffect("working")),
        ("UserPromptSubmit", {"session_id": "../../etc"}, HookEffect("working")),
        ("SessionStart", {"session_id": 42}, HookEffect("idle")),
        ("SessionStart", {"session_id": None, "source": ["compact"]}, HookEffect("idle")),
        # A tool name that is not a string reads as "a tool"; tool_input of the wrong shape
        # gives no detail.
        (
            "PermissionRequest",
            {"tool_name": 7, "tool_input": "ls"},
            HookEffect("waiting", "permission for a tool"),
        ),
        (
            "PermissionRequest",
            {"tool_name": "Bash", "tool_input": {"command": ["ls"]}},
            HookEffect("waiting", "permission for Bash"),
        ),
        (
            "PreToolUse",
            {"tool_name": "AskUserQuestion", "tool_input": None},
            HookEffect("waiting", "question"),
        ),
        (
            "PreToolUse",
            {"tool_name": "AskUserQuestion", "tool_input": {"questions": "which?"}},
            HookEffect("waiting", "question"),
        ),
        (
            "PreToolUse",
            {"tool_name": "AskUserQuestion", "tool_input": {"questions": [{"question": 3}]}},
            HookEffect("waiting", "question"),
        ),
        (
            "Notification",
            {"notification_type": "permission_prompt", "message": 5},
            HookEffect("waiting", restates=True),
        ),
        ("Notification", {"notification_type": None}, HookEffect(None)),
    ],
)
def test_bad_payloads_never_raise(event: str, payload: dict[str, Any], effect: HookEffect) -> None:
    assert interpret(event, payload) == effect


def test_every_event_we_hook_is_interpreted_without_a_payload() -> None:
    for event in EVENTS:
        assert isinstance(interpret(event, {}), HookEffect)


def test_a_long_reason_is_one_bounded_line() -> None:
    effect = interpret(
        "PermissionRequest", {"tool_name": "Bash", "tool_input": {"command": "x\n" * 500}}
    )
    assert effect.reason is not None
    assert "\n" not in effect.reason
    assert len(effect.reason) == 300
    assert effect.reason.endswith("…")


def test_the_layout_follows_claude_codes_own() -> None:
    assert config_dir({"HOME": "/home/u"}) == Path("/home/u/.claude")
    assert config_dir({"HOME": "/home/u", "CLAUDE_CONFIG_DIR": "/c"}) == Path("/c")
    assert config_dir({"CLAUDE_CONFIG_DIR": ""}) == Path("/root/.claude")
    assert project_dir(Path("/c"), Path("/work/my_repo.v2")) == Path("/c/projects/-work-my-repo-v2")
    assert transcript(Path("/c"), Path("/w"), SESSION) == Path(f"/c/projects/-w/{SESSION}.jsonl")


def test_the_pinned_session_resumes_only_a_conversation_claude_code_has(tmp_path: Path) -> None:
    workspace = Path("/workspace")
    assert session_args(SESSION, tmp_path, workspace, has_history=True) == (
        ("--session-id", SESSION),
        SESSION,
    )
    path = transcript(tmp_path, workspace, SESSION)
    path.parent.mkdir(parents=True)
    path.write_text("{}\n")
    assert session_args(SESSION, tmp_path, workspace, has_history=True) == (
        ("--resume", SESSION),
        SESSION,
    )
    assert session_args(None, tmp_path, workspace, has_history=True) == (("--continue",), None)
    args, fresh = session_args(None, tmp_path, workspace, has_history=False)
    assert args == ("--session-id", fresh)
    assert fresh is not None
    assert fresh != SESSION


def test_before_a_tool_only_a_question_to_the_user_is_hooked(tmp_path: Path) -> None:
    """PreToolUse says nothing new for any other tool (the turn is already `working`): Claude
    Code 2.1.330 honours the matcher (checked with the real CLI: a Bash call made no
    PreToolUse request), sparing it an HTTP call per tool use."""
    document = claude_code.settings("http://127.0.0.1:1/hooks/claude-code/", "s", tmp_path / "x")
    assert document["hooks"]["PreToolUse"][0]["matcher"] == "AskUserQuestion"
    assert all(
        "matcher" not in entry
        for event, entries in document["hooks"].items()
        if event != "PreToolUse"
        for entry in entries
    )
