"""What is told of an approval as it changes: its events on the bus (`approval-requested`,
`approval-resolved`) and its records in the audit trail, with the facts the policy saw (so that
`sidecar policy test` can replay a draft against them). One listener, given to `Approvals`.
"""

from __future__ import annotations

import time
from typing import Any

from sidecar.agent.approvals import Answer, Approval
from sidecar.audit.records import ApprovalRequestedRecord, ApprovalResolvedRecord
from sidecar.audit.trail import AuditTrail
from sidecar.core.event_shapes import ApprovalRequested, ApprovalResolved
from sidecar.core.events import EventBus
from sidecar.core.text import one_line

MAX_FACT = 4096  # characters of a command or path kept in a record


def _fact(text: str | None) -> str | None:
    return None if text is None else text[:MAX_FACT]


class ApprovalLog:
    def __init__(self, bus: EventBus, audit: AuditTrail | None) -> None:
        self.bus = bus
        self.audit = audit

    def __call__(self, approval: Approval, answer: Answer | None) -> None:
        if answer is None and approval.withdrawn is None:
            self.bus.publish(
                ApprovalRequested(
                    id=approval.id, tool=approval.tool, summary=approval.summary, kind=approval.kind
                )
            )
            self._requested(approval)
            return
        resolved = ApprovalResolved(
            id=approval.id,
            decision=answer.decision if answer else None,
            by=answer.by if answer else None,
            kind=approval.kind,
            tool=approval.tool,
            summary=approval.summary,
        )
        if answer is None:
            resolved.reason = approval.withdrawn or ""
        elif answer.rule is not None:
            resolved.rule = answer.rule
        self.bus.publish(resolved)
        self._resolved(approval, answer)

    def _requested(self, approval: Approval) -> None:
        if self.audit is not None:
            self.audit.write(ApprovalRequestedRecord(**_common(approval), rule=approval.rule))

    def _resolved(self, approval: Approval, answer: Answer | None) -> None:
        if self.audit is None:
            return
        facts = approval.facts
        self.audit.write(
            ApprovalResolvedRecord(
                **_common(approval),
                decision=answer.decision if answer else None,
                by=answer.by if answer else None,
                waited=round(time.monotonic() - approval.started, 3),
                rule=answer.rule if answer and answer.rule else approval.rule,
                reason=one_line(approval.withdrawn) if approval.withdrawn else None,
                command=_fact(facts.command) if facts else None,
                path=_fact(facts.path) if facts else None,
                outside=facts.outside if facts else False,
                host=facts.host if facts else None,
                port=facts.port if facts else None,
            )
        )


def _common(approval: Approval) -> dict[str, Any]:
    """The fields both records of an approval have."""
    return {
        "id": approval.id,
        "kind": approval.kind,
        "tool": approval.tool,
        "summary": approval.summary,
        "source": approval.source,
        "cli": approval.facts.cli if approval.facts else None,
    }
