"""`GET /approvals` and `POST /approvals/{id}`: the agent's permission requests, listed and
answered by id (`sidecar.agent.approvals` owns them; this module only speaks HTTP).
"""

from __future__ import annotations

from aiohttp import web
from msgspec import UnsetType

from sidecar.agent.approvals import AlreadyAnswered, Answer, Approvals
from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.core.shapes import (
    MAX_APPROVAL_MESSAGE,
    ApprovalConflict,
    ApprovalDecided,
    ApprovalItem,
    ApprovalRequest,
    ApprovalsAnswer,
)
from sidecar.pane.send import FORBIDDEN

ID_PARAMETER = {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}


def approval_conflict(exc: AlreadyAnswered) -> ApprovalConflict:
    if exc.answer is None:
        return ApprovalConflict(
            error=f"permission request {exc.id} was withdrawn: {exc.withdrawn}",
            id=exc.id,
            decision=None,
            by=None,
            reason=exc.withdrawn or "",
        )
    return ApprovalConflict(
        error=f"permission request {exc.id} was answered already: "
        f"{exc.answer.decision} by {exc.answer.by}",
        id=exc.id,
        decision=exc.answer.decision,
        by=exc.answer.by,
    )


def approval_operations(approvals: Approvals) -> list[Operation]:
    async def listing(request: web.Request) -> web.Response:
        return httpio.answer(
            ApprovalsAnswer(
                approvals=[
                    ApprovalItem(
                        id=a.id,
                        tool=a.tool,
                        summary=a.summary,
                        input=a.input,
                        since=a.since,
                        source=a.source,
                        kind=a.kind,
                        rule=a.rule,
                    )
                    for a in approvals.pending()
                ]
            )
        )

    async def decide(request: web.Request) -> web.Response:
        body = await httpio.read_body(request, ApprovalRequest)
        message = None if isinstance(body.message, UnsetType) else body.message
        if message is not None:
            bad = FORBIDDEN.search(message)
            if bad is not None:
                msg = (
                    f"invalid body: `message` holds control character U+{ord(bad.group()):04X}"
                    f" at offset {bad.start()}; tab and newline are the only ones allowed"
                )
                raise httpio.BadRequest(msg)
            if len(message.encode("utf-8", "surrogatepass")) > MAX_APPROVAL_MESSAGE:
                msg = f"invalid body: `message` is over {MAX_APPROVAL_MESSAGE} bytes of UTF-8"
                raise httpio.BadRequest(msg)
        remember = False if isinstance(body.remember, UnsetType) else body.remember
        approval_id = request.match_info["id"]
        answer = approvals.answer(approval_id, Answer(body.decision, "api", message, remember))
        if approvals.durable is not None:
            await approvals.durable()  # the decision is on the audit trail before it is told
        return httpio.answer(ApprovalDecided(id=approval_id, decision=answer.decision, by="api"))

    return [
        Operation(
            "GET",
            "/approvals",
            listing,
            "getApprovals",
            "status",
            "The permission requests the agent waits on now",
            {200: ApprovalsAnswer},
            description="Oldest first. Each stays listed until it is answered (here, by a "
            "person in the terminal, or by SIDECAR_APPROVAL_TIMEOUT) or withdrawn (the turn "
            "was interrupted, the CLI exited). The view token is enough.",
        ),
        Operation(
            "POST",
            "/approvals/{id}",
            decide,
            "postApproval",
            "control",
            "Answer one permission request, exactly once",
            {200: ApprovalDecided},
            description="The answer goes to the CLI through its own decision channel where it "
            "has one (a held hook), else as keys into the dialog on screen; an `egress` "
            "request's answer lets the held request through (with `remember`: its host and "
            "port join the allowlist) or refuses it with a 403 the agent can read. 404: no such "
            "request; 409: answered already (`decision` and `by` name the first answer) or "
            "withdrawn (`reason`); 400: anything else. The view token may not answer.",
            body=ApprovalRequest,
            errors=(400, 404, 409),
            parameters=(ID_PARAMETER,),
        ),
    ]
