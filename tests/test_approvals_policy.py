"""The approvals book with a policy (`sidecar.agent.approvals`, driven directly, with the real
audit trail on disk): a rule's allow or deny answers a request at once, never listed, only its
`approval-resolved` told; `ask` lists it naming the rule; a dialog read off the screen is never
allowed by a rule but is denied by one; a decision is returned only once its record is on disk;
an egress request's own timeout names SIDECAR_EGRESS_ASK; the policy's decisions are counted
by rule; a spent budget refuses before the policy is asked."""

from __future__ import annotations

import json
from pathlib import Path

from sidecar.agent.approval_log import ApprovalLog
from sidecar.agent.approvals import Answer, Approvals
from sidecar.audit.trail import NAME, AuditTrail
from sidecar.core.events import EventBus
from sidecar.policy.load import parse_policy
from sidecar.policy.rules import Facts

POLICY = """\
rules:
  - name: git-read
    match: {tool: Bash, command: '^git status$'}
    action: allow
  - name: no-rm
    match: {tool: [Bash, Shell], command: '^rm '}
    action: deny
    message: no removing
  - name: shell-echo
    match: {tool: Shell, command: '^echo '}
    action: allow
"""


def book(tmp_path: Path) -> tuple[Approvals, EventBus, AuditTrail]:
    bus = EventBus()
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    approvals = Approvals(None, ApprovalLog(bus, trail), policy=parse_policy(POLICY, "p.yaml"))
    approvals.durable = trail.synced
    approvals.cli = "claude-code"
    return approvals, bus, trail


async def test_a_rule_answers_at_once_and_nothing_is_listed(tmp_path: Path) -> None:
    approvals, bus, trail = book(tmp_path)
    sub = bus.subscribe()
    allowed = approvals.request("Bash", {"command": "git status"}, source="hooks")
    denied = approvals.request("Bash", {"command": "rm -rf build"}, source="hooks")
    assert approvals.pending() == []
    answer = await approvals.decision(allowed.id)
    assert (answer.decision, answer.by, answer.rule) == ("allow", "policy", "git-read")
    refusal = await approvals.decision(denied.id)
    assert (refusal.decision, refusal.message, refusal.rule) == ("deny", "no removing", "no-rm")
    events = [json.loads(await sub.get() or b"{}") for _ in range(2)]
    assert [(e["type"], e["by"], e["rule"]) for e in events] == [
        ("approval-resolved", "policy", "git-read"),
        ("approval-resolved", "policy", "no-rm"),
    ]
    # Returned only once on disk: the file has both records now.
    on_disk = [json.loads(line) for line in (tmp_path / NAME).read_text().splitlines()]
    assert [(r["type"], r["rule"], r["command"]) for r in on_disk] == [
        ("approval-resolved", "git-read", "git status"),
        ("approval-resolved", "no-rm", "rm -rf build"),
    ]
    assert approvals.decided["allow", "policy"] == 1
    assert approvals.by_rule == {("git-read", "allow"): 1, ("no-rm", "deny"): 1}
    await trail.close()


async def test_no_rule_asks_a_person_naming_the_default(tmp_path: Path) -> None:
    approvals, _, trail = book(tmp_path)
    asked = approvals.request("Bash", {"command": "git status; ls"}, source="hooks")
    assert [a.id for a in approvals.pending()] == [asked.id]
    assert asked.rule == "default"
    await trail.close()


async def test_a_dialog_on_screen_is_denied_by_a_rule_but_never_allowed(tmp_path: Path) -> None:
    approvals, _, trail = book(tmp_path)
    shown = approvals.request("Shell", {"title": "Shell", "dialog": "echo hi"}, source="screen")
    assert [a.id for a in approvals.pending()] == [shown.id]  # listed for a person
    assert shown.rule == "shell-echo"  # the rule that would have allowed it
    removing = approvals.request("Shell", {"title": "Shell", "dialog": "rm x"}, source="screen")
    answer = await approvals.decision(removing.id)
    assert (answer.decision, answer.by) == ("deny", "policy")
    await trail.close()


async def test_an_egress_request_times_out_on_its_own_clock(tmp_path: Path) -> None:
    approvals, _, trail = book(tmp_path)
    facts = Facts(kind="egress", tool="egress", host="x.example", port=443)
    held = approvals.request(
        "egress", {"host": "x.example"}, source="proxy", kind="egress", facts=facts,
        summary="CONNECT x.example:443", timeout=0.05,
    )  # fmt: skip
    answer = await approvals.decision(held.id)
    assert (answer.decision, answer.by) == ("deny", "timeout")
    assert answer.message is not None and "within 0.05 s (SIDECAR_EGRESS_ASK)" in answer.message
    assert held.summary == "CONNECT x.example:443" and held.kind == "egress"
    await trail.close()


async def test_a_spent_budget_refuses_what_a_rule_would_allow(tmp_path: Path) -> None:
    """The budget's gate (`sidecar.agent.spending`) answers before the policy is asked: a rule's
    allow never outruns a spent budget."""
    approvals, _, trail = book(tmp_path)
    approvals.gate = lambda: Answer("deny", "budget", "the budget is spent")
    asked = approvals.request("Bash", {"command": "git status"}, source="hooks")
    answer = await approvals.decision(asked.id)
    assert (answer.decision, answer.by, answer.rule) == ("deny", "budget", None)
    assert approvals.by_rule == {}
    await trail.close()
