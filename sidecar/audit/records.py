"""The audit trail's schema, `sleeve-audit/1`: one JSON object per line, `type` first, with `seq`
(increasing for the trail's life, across rotations and supervisor restarts), `time` and `sleeve`;
a field at its default (null, false, 0) is left out.
Approvals and changes are the sidecar's own records; an egress connection follows OCSF's Network
Activity class (4001) in content — who (pid, exe), where (host, port), what was decided and by
which rule, bytes each way, duration — with flat field names (docs/audit.md maps them).
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

from msgspec import Meta, Struct, field

from sidecar.core.contract import ApprovalKind, DecidedBy, Decision, rfc3339
from sidecar.core.shapes import Answer, Timestamp

SCHEMA: Final = "sleeve-audit/1"
Kind = ApprovalKind


class Record(Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """One line of the audit trail; `type` tells which."""

    seq: Annotated[int, Meta(ge=0, description="increasing for the trail's life")] = 0
    time: Timestamp = field(default_factory=rfc3339)
    sleeve: Annotated[str, Meta(description="`SLEEVE_NAME`")] = ""


class ApprovalRequestedRecord(Record, tag="approval-requested"):
    """A permission or egress request was listed for a person (not written for one the policy
    decided at once: its `approval-resolved` says all)."""

    id: str
    kind: Kind
    tool: str
    summary: str
    source: str
    cli: str | None = None
    rule: Annotated[str | None, Meta(description="the policy rule that said `ask`")] = None


class ApprovalResolvedRecord(Record, tag="approval-resolved"):
    """A request was decided (`decision`, `by`, `rule`) or withdrawn (`decision` null,
    `reason`). The request's facts as the policy saw them (`command`, `path`, `outside`,
    `host`, `port`) are kept, so that a draft policy can be replayed against them."""

    id: str
    kind: Kind
    tool: str
    summary: str
    source: str
    decision: Decision | None
    by: DecidedBy | None
    waited: Annotated[float, Meta(ge=0, description="seconds from the request to this")]
    cli: str | None = None
    rule: str | None = None
    reason: str | None = None
    command: str | None = None
    path: Annotated[str | None, Meta(description="relative to the workspace")] = None
    outside: bool = False
    host: str | None = None
    port: int | None = None


class EgressConnectionRecord(Record, tag="egress-connection"):
    """One connection the CLI asked for (through the proxy, or refused by the guard), when it
    ended. `rule`: the allowlist pattern, `approval:<id>`, `policy:<rule>` or `also` (the
    sidecar's own API) that allowed it, else null."""

    host: str
    port: int
    how: str
    allowed: bool
    method: str | None = None
    rule: str | None = None
    reason: Annotated[str | None, Meta(description="why it was refused")] = None
    bytes_in: Annotated[int, Meta(ge=0, description="bytes from the far end to the CLI")] = 0
    bytes_out: Annotated[int, Meta(ge=0, description="bytes from the CLI to the far end")] = 0
    duration: Annotated[float, Meta(ge=0, description="seconds the connection was open")] = 0.0
    pid: int | None = None
    exe: str | None = None
    uid: int | None = None


class EgressChangedRecord(Record, tag="egress-changed"):
    """The allowlist changed: `PATCH /egress` (`api`), an approval's remember (`approval`), or
    the allow file read again on SIGHUP (`reload`)."""

    added: list[str]
    removed: list[str]
    by: Literal["api", "approval", "reload"]
    allow: Annotated[list[str], Meta(description="the whole list after the change")]


class PolicyChangedRecord(Record, tag="policy-changed"):
    """The policy was read (`start`) or read again (`reload`); `error`: the file was refused
    and the policy before it stays."""

    file: str
    by: Literal["start", "reload"]
    rules: int = 0
    default: str | None = None
    error: str | None = None


class ResleeveRecord(Record, tag="resleeve"):
    """A resleeve ended: the CLI before and after it."""

    previous: str
    cli: str
    pid: int | None = None


class AuditDroppedRecord(Record, tag="audit-dropped"):
    """Records were lost: the disk refused them for longer than memory could hold them."""

    count: Annotated[int, Meta(ge=1)]
    reason: str


AnyRecord = (
    ApprovalRequestedRecord
    | ApprovalResolvedRecord
    | EgressConnectionRecord
    | EgressChangedRecord
    | PolicyChangedRecord
    | ResleeveRecord
    | AuditDroppedRecord
)
TYPES: Final[tuple[str, ...]] = tuple(t.__struct_config__.tag for t in get_args(AnyRecord))


class AuditAnswer(Answer):
    """Audit records, oldest first."""

    records: list[AnyRecord]
    truncated: Annotated[
        bool, Meta(description="more records matched than `limit`: the latest are given")
    ] = False
