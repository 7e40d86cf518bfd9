"""Codex's hooks as the sidecar installs them, without the CLI: the trust hash against one Codex
0.169.0 wrote itself, the `-c` overrides, what each event means, the PermissionRequest reply,
and the relay's target in our settings file."""

from __future__ import annotations

import json
import shlex
import tomllib
from pathlib import Path

from sidecar.agent import hook_relay
from sidecar.agent.approvals import Answer
from sidecar.agent.clis.codex import hooks as codex


def test_trust_hash_is_the_one_codex_records() -> None:
    """Codex 0.169.0's "Trust all" wrote this hash for this hook (`hooks.state` in config.toml)."""
    handler = {"type": "command", "command": "/tmp/cx/hook.sh Stop", "timeout": 600}
    assert codex.trust_hash("Stop", {**handler, "async": False}) == (
        "sha256:a6aa17bfd0b89f6190ddc599294a7cef9e4e0c3011c618f80e169f46ed3616ed"
    )


def test_overrides_parse_as_toml_and_trust_each_hook(tmp_path: Path) -> None:
    settings = tmp_path / "codex hooks.json"  # a space: the command is a shell line
    args = codex.overrides(settings)
    values = [a for a in args if a != "-c"]
    assert len(values) == len(codex.EVENTS) + 1
    parsed = {}
    for value in values:
        key, toml_value = value.split("=", 1)
        parsed[key] = tomllib.loads(f"v = {toml_value}")["v"]
    state = parsed.pop("hooks.state")
    hashes = set()
    for event in codex.EVENTS:
        handler = parsed[f"hooks.{event}"][0]["hooks"][0]
        assert shlex.split(handler["command"])[-2:] == [str(settings), event]
        assert handler["command"] == hook_relay.command(settings, event)
        hashes.add(codex.trust_hash(event, handler))
    assert "/<session-flags>/config.toml:user_prompt_submit:0:0" in state
    assert {s["trusted_hash"] for s in state.values()} == hashes
    assert "secret" not in " ".join(args)


def test_what_each_event_means() -> None:
    session = "01a20ec7-30cb-7101-a1a8-f0844ecd7c05"
    ask = {
        "session_id": session,
        "tool_name": "Bash",
        "tool_input": {"command": "touch x", "description": "why"},
    }
    assert codex.interpret("SessionStart", {"session_id": session}).state is None
    assert codex.interpret("SessionStart", {"session_id": session}).session_id == session
    assert codex.interpret("UserPromptSubmit", {}).state == "working"
    waiting = codex.interpret("PermissionRequest", ask)
    assert (waiting.state, waiting.reason) == ("waiting", "permission for Bash: touch x")
    assert codex.interpret("PostToolUse", {}).state == "working"
    assert codex.interpret("Stop", {}).state == "idle"
    assert codex.interpret("Interrupt", {}).state == "idle"
    assert codex.interpret("PreCompact", {}).state is None
    hooks = codex.HOOKS
    permission = hooks.permission("PermissionRequest", ask)
    assert permission is not None and permission.tool == "Bash"
    assert hooks.permission("Stop", ask) is None


def test_the_permission_reply() -> None:
    """Codex fails closed on fields it does not take: none but behavior and a deny's message."""
    allow = codex.HOOKS.answer(Answer("allow", "api", "ignored", remember=True), {})
    assert allow == {
        "hookSpecificOutput": {
            "hookEventName": "PermissionRequest",
            "decision": {"behavior": "allow"},
        }
    }
    deny = codex.HOOKS.answer(Answer("deny", "api", "not now"), {})
    assert deny["hookSpecificOutput"]["decision"] == {"behavior": "deny", "message": "not now"}


def test_the_relay_finds_each_events_url_and_timeout(tmp_path: Path) -> None:
    settings = tmp_path / "codex-hooks.json"
    settings.write_text(json.dumps(codex.settings("http://127.0.0.1:9/hooks/codex/", "s3")))
    url, headers, timeout = hook_relay.target(str(settings), "PermissionRequest") or ("", {}, 0)
    assert url == "http://127.0.0.1:9/hooks/codex/PermissionRequest"
    assert headers == {"X-Sidecar-Hook": "s3"}
    assert timeout == codex.PERMISSION_TIMEOUT
    # An event without a hook of its own (Claude Code's SessionStart): another's URL for it.
    stop = {"type": "http", "url": "http://h/x/Stop", "headers": {}}
    document = {"hooks": {"Stop": [{"hooks": [stop]}]}}
    settings.write_text(json.dumps(document))
    assert hook_relay.target(str(settings), "SessionStart") == (
        "http://h/x/SessionStart",
        {},
        hook_relay.TIMEOUT,
    )
