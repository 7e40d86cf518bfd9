"""`sidecar policy test`: the decisions of the audit trail (its `approval-resolved` records, each
with the facts the policy saw) replayed against a draft policy, keeping those it would decide
differently — another answer, or the same answer by someone else (a rule where a person
decided, a person where a rule did). Pure: records in, differences out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.policy.rules import Facts, Policy


@dataclass(frozen=True)
class Difference:
    record: Mapping[str, Any]
    then: str  # "deny by api", "allow by policy (rule x)"
    now: str  # "deny (rule y)", "ask a person"

    def line(self) -> str:
        r = self.record
        what = f"{r.get('time')} {r.get('id')} {r.get('tool')}: {r.get('summary')}"
        return f"{what} — was {self.then}, now {self.now}"


def facts_of(record: Mapping[str, Any]) -> Facts:
    def text(key: str) -> str | None:
        value = record.get(key)
        return value if isinstance(value, str) else None

    port = record.get("port")
    return Facts(
        kind="egress" if record.get("kind") == "egress" else "tool",
        tool=text("tool") or "",
        cli=text("cli"),
        command=text("command"),
        path=text("path"),
        outside=record.get("outside") is True,
        host=text("host"),
        port=port if isinstance(port, int) else None,
    )


def _then(record: Mapping[str, Any]) -> str:
    by = record.get("by")
    rule = f" (rule {record.get('rule')})" if by == "policy" else ""
    return f"{record.get('decision')} by {by}{rule}"


def differences(draft: Policy, records: Iterable[Mapping[str, Any]]) -> list[Difference]:
    """The decisions among `records` that `draft` would make differently."""
    out = []
    for record in records:
        if record.get("type") != "approval-resolved" or record.get("decision") is None:
            continue  # withdrawn: nothing was decided
        verdict = draft.decide(facts_of(record))
        action = verdict.action
        if action == "allow" and record.get("source") == "screen":
            action = "ask"  # a rule never allows a dialog read off the screen
        by_policy = record.get("by") == "policy"
        if action == "ask":
            if by_policy:
                out.append(Difference(record, _then(record), "ask a person"))
            continue
        same_rule = by_policy and verdict.rule == record.get("rule")
        if action != record.get("decision") or not same_rule:
            out.append(Difference(record, _then(record), f"{action} (rule {verdict.rule})"))
    return out
