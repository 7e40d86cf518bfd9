"""The policy with the real Claude Code (2.1.330) against the API stub on loopback: a rule that
allows `Bash` with an anchored `command` lets the command run with no approval listed
(`approval-resolved` `by: policy` with the rule, in /metrics and the audit
trail); a `deny` rule's message reaches the model and the command does not run; an `ask` rule
lists the request as without a policy, naming the rule.

The allowed command is a `touch`, not an `echo`: Claude Code runs `echo` (and other read-only
commands) without asking at all (measured on 2.1.330), so no request would reach the policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, wait_for

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
POLICY = """\
rules:
  - name: touch-policy-files
    match: {kind: tool, cli: claude-code, tool: Bash, command: '^touch policy-[a-z]+\\.txt$'}
    action: allow
  - name: no-removing
    match: {tool: Bash, command: '^rm '}
    action: deny
    message: Removing files is not allowed in this sleeve; leave them be.
  - name: touch-asks
    match: {tool: bash, command: '^touch '}
    action: ask
"""


def prompted(
    make_sidecar: Callable[..., Sidecar], stub: AnthropicStub, tmp_path: Path
) -> tuple[Sidecar, EventLog]:
    """A sidecar with the policy, whose Claude Code was asked to run the stub's command."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    sc = make_sidecar(cli="claude-code", env_extra={"SIDECAR_POLICY_FILE": str(policy)})
    sc.env_extra.update(claude_env(sc, stub))
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]}).status == 202
    return sc, events


def test_an_allow_rule_runs_the_tool_with_nobody_asked(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    tmp_path: Path,
) -> None:
    stub = stub_factory(bash_command="touch policy-ran.txt")
    sc, events = prompted(make_sidecar, stub, tmp_path)
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["decision"], resolved["by"], resolved["rule"]) == (
        "allow", "policy", "touch-policy-files",
    )  # fmt: skip
    assert (resolved["tool"], resolved["summary"]) == ("Bash", "touch policy-ran.txt")
    wait_for(lambda: (sc.workspace / "policy-ran.txt").exists(), 20, what="the command ran")
    wait_agent(sc, "idle")
    assert events.of("approval-requested") == []
    # Claude Code draws its dialog while the hook is pending, and the screen says so for the
    # moment it is up; what matters is that nobody is asked: nothing listed, ever.
    metrics = sc.get("/metrics").body.decode()
    assert 'sidecar_approvals_decided_total{decision="allow",by="policy"} 1' in metrics
    assert 'sidecar_policy_decisions_total{rule="touch-policy-files",decision="allow"} 1' in (
        metrics
    )
    [record] = sc.get("/audit?type=approval-resolved").body["records"]
    assert (record["by"], record["rule"], record["command"], record["cli"]) == (
        "policy", "touch-policy-files", "touch policy-ran.txt", "claude-code",
    )  # fmt: skip
    assert sc.get("/audit?type=approval-requested").body["records"] == []


def test_a_deny_rules_message_reaches_the_model(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    tmp_path: Path,
) -> None:
    stub = stub_factory(bash_command="rm keep.txt")
    sc, events = prompted(make_sidecar, stub, tmp_path)
    (sc.workspace / "keep.txt").write_text("still here")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["decision"], resolved["by"], resolved["rule"]) == (
        "deny", "policy", "no-removing",
    )  # fmt: skip
    wait_for(
        lambda: any("Removing files is not allowed" in r for r in stub.tool_results()),
        20,
        what="the rule's message in the tool result",
    )
    wait_agent(sc, "idle")
    assert (sc.workspace / "keep.txt").read_text() == "still here"
    assert events.of("approval-requested") == []


def test_an_ask_rule_lists_the_request_for_a_person(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    tmp_path: Path,
) -> None:
    stub = stub_factory(bash_command="touch asked.txt")
    sc, events = prompted(make_sidecar, stub, tmp_path)
    requested = events.wait(lambda e: e["type"] == "approval-requested", "approval-requested")
    [item] = sc.get("/approvals").body["approvals"]
    assert (item["id"], item["rule"], item["kind"], item["source"]) == (
        requested["id"], "touch-asks", "tool", "hooks",
    )  # fmt: skip
    assert wait_agent(sc, "waiting")["reason"]
    assert sc.post(f"/approvals/{item['id']}", {"decision": "allow"}).status == 200
    wait_for(lambda: (sc.workspace / "asked.txt").exists(), 20, what="the command ran")
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["by"], "rule" in resolved) == ("api", False)
    record = sc.get("/audit?type=approval-resolved").body["records"][0]
    assert (record["by"], record["rule"]) == ("api", "touch-asks")
