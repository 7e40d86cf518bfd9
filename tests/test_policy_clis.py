"""The policy with the other real CLIs, one decision each, through each CLI's own channel: Codex
(0.169.0) is answered through its held PermissionRequest hook (a deny rule's message reaches the
model, the command does not run); Gemini CLI (0.61.0), which has no hook that decides, gets the
deny rule's keys typed into its confirmation (a rule never allows a dialog read off the screen:
`sidecar.agent.approvals`); opencode (1.18.33) gets an allow rule's answer through its
permission reply. All talk to `tests.e2e.tool_stub` on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agenttools import EventLog, wait_agent
from tests.clitools import (
    OPENCODE_TOKEN,
    RAN,
    chat_stub,
    codex_sidecar,
    gemini_sidecar,
    opencode_sidecar,
    rollout,
    run_dir,
    stub_for,
    tool_stub,
)
from tests.harness import Sidecar, wait_for, write_cli_config

__all__ = ["chat_stub", "run_dir", "stub_for", "tool_stub"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def policy_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return str(path)


def test_codex_is_answered_by_a_deny_rule_through_its_hook(
    make_sidecar: Callable[..., Sidecar], tool_stub: str, tmp_path: Path
) -> None:
    policy = policy_file(
        tmp_path,
        "rules:\n  - name: no-codex-marker\n    match: {cli: codex, tool: Bash, command: "
        "'CODEX-RAN'}\n    action: deny\n    message: NOT-BY-POLICY\n",
    )
    sc = codex_sidecar(make_sidecar, tool_stub, SIDECAR_POLICY_FILE=policy).start()
    events = EventLog(sc)
    wait_agent(sc, "idle", 60)
    assert sc.post("/input", {"text": "please run the command", "if_state": ["idle"]})[0] == 202
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "resolved", 60)
    assert (resolved["decision"], resolved["by"], resolved["rule"]) == (
        "deny", "policy", "no-codex-marker",
    )  # fmt: skip
    assert RAN in resolved["summary"]
    session = wait_agent(sc, "idle", 60)["session_id"]
    wait_for(lambda: "NOT-BY-POLICY" in rollout(sc, session), 20, what="the rule's message")
    assert not (sc.workspace / "ran.txt").exists()
    assert events.of("approval-requested") == []


def test_gemini_gets_a_deny_rules_keys_on_its_confirmation(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
    tmp_path: Path,
) -> None:
    command = "touch gemini-ran.txt"
    policy = policy_file(
        tmp_path,
        "rules:\n  - name: no-gemini-files\n    match: {cli: gemini-cli, tool: Shell, command: "
        "'gemini-ran'}\n    action: deny\n",
    )
    # The prompt is on Gemini's command line (-i), not typed: on a loaded machine Gemini 0.61
    # draws its input before it takes an Enter, and a typed prompt can sit there unsent.
    clis = write_cli_config(
        tmp_path / "clis.yaml",
        {
            "gemini-cli": {
                "command": ["gemini", "-i", "please run the command"],
                "state": "hooks",
                "prompt": True,
            }
        },
    )
    sc = gemini_sidecar(
        make_sidecar,
        stub_for(command),
        run_dir(),
        SIDECAR_POLICY_FILE=policy,
        SIDECAR_CLI_CONFIG=str(clis),
    ).start()
    events = EventLog(sc)
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "resolved", 60)
    assert (resolved["decision"], resolved["by"], resolved["rule"]) == (
        "deny", "policy", "no-gemini-files",
    )  # fmt: skip
    assert resolved["summary"] == command
    wait_agent(sc, "idle", 60)  # the confirmation took the deny's key ("3")
    assert not (sc.workspace / "gemini-ran.txt").exists()
    assert events.of("approval-requested") == []
    assert sc.get("/approvals").body["approvals"] == []
    [record] = sc.get("/audit?type=approval-resolved").body["records"]
    assert (record["source"], record["command"]) == ("screen", command)


def test_opencode_is_answered_by_an_allow_rule_through_its_reply(
    make_sidecar: Callable[..., Sidecar], chat_stub: Callable[[str], int], tmp_path: Path
) -> None:
    """The rule's allow goes back through opencode's permission reply: the command runs and no
    request is listed. (The agent reads `waiting` between opencode's request and its reply:
    opencode's events say a request is open until the reply's event.)"""
    marker = "touch opencode-ran.txt"  # one simple command: an allow rule matches no pipeline
    policy = policy_file(
        tmp_path,
        "rules:\n  - name: opencode-echo\n    match: {cli: opencode, tool: bash, command: "
        "'^touch opencode-ran[.]txt$'}\n    action: allow\n",
    )
    sc = opencode_sidecar(make_sidecar, chat_stub(marker))
    sc.env_extra["SIDECAR_POLICY_FILE"] = policy
    sc.start()
    events = EventLog(sc, OPENCODE_TOKEN)
    wait_agent(sc, "idle", 60)
    code, body = sc.post("/input", {"text": "please run the command", "if_state": ["idle"]})
    assert code == 202 and body["delivered"] is True, body
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "resolved", 60)
    assert (resolved["decision"], resolved["by"], resolved["rule"]) == (
        "allow", "policy", "opencode-echo",
    )  # fmt: skip
    wait_for(lambda: (sc.workspace / "opencode-ran.txt").exists(), 30, what="the command ran")
    wait_agent(sc, "idle", 60)
    assert events.of("approval-requested") == []
    assert sc.get("/approvals").body["approvals"] == []
