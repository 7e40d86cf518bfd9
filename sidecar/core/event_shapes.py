"""Every line of `GET /events`, declared once: published on the bus (`sidecar.core.events`),
encoded from these on the way out, and the stream's OpenAPI schema generated from them. A new
kind of event is one class here and one entry of `AnyEvent`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType, field

from sidecar.core.contract import EgressHow, Status, rfc3339
from sidecar.core.shapes import (
    AgentStateField,
    ApprovalKindField,
    ChannelName,
    DecidedByField,
    DecisionField,
    NotifyKind,
    ProcStateName,
    Progress,
    Timestamp,
)

EgressHowField = Annotated[
    EgressHow,
    Meta(
        description="`proxy`: refused by the egress proxy; `direct`: a TCP connection around "
        "it; `udp` (DNS included), `ipv6`, `raw`: sockets the enforcement refused; `unix`: a "
        "unix socket leading out of the guard (the sidecar's tmux, a daemon's socket)"
    ),
]


class Event(Struct, tag_field="type", kw_only=True):
    """One line of `/events`; `type` tells which."""

    time: Timestamp = field(default_factory=rfc3339)


class Heartbeat(Event, tag="heartbeat"):
    """The first line of every stream (but see `sidecar-restart`), and after 15 s of silence."""


class SidecarRestart(Event, tag="sidecar-restart"):
    """The first line of a stream from a supervisor that init started again after a crash (at
    `time`). Streams of the dead one were cut; what happened in between is not replayed."""

    restarts: Annotated[int, Meta(ge=1, description="supervisor crashes so far")]


class ProgressUpdate(Event, tag="progress-update"):
    """CURRENT.md's status, task or progress changed."""

    status: Status
    task: str | None
    progress: Progress


class Completion(Event, tag="completion"):
    """CURRENT.md's status became `done`."""

    task: str | None


class CliExit(Event, tag="cli-exit"):
    """The CLI ended by itself."""

    cli: str
    exit_code: int | None
    pid: int | None


class Resleeve(Event, tag="resleeve"):
    """A resleeve started (`phase` `started`) or ended (`done`, with the new CLI's pid and
    state)."""

    phase: Literal["started", "done"]
    previous: str
    cli: str
    pid: int | UnsetType | None = UNSET
    state: ProcStateName | UnsetType = UNSET


class ErrorEvent(Event, tag="error"):
    """Something went wrong that the envoy may want to know about."""

    message: str
    cli: str | UnsetType = UNSET


class AgentStateEvent(Event, tag="agent-state"):
    """The agent's state (or the reason for it) changed."""

    state: AgentStateField
    previous: AgentStateField
    reason: str | None


class InboxNotified(Event, tag="inbox-notified"):
    """A notice about new inbox messages was typed into the CLI."""

    ids: Annotated[list[str], Meta(description="the messages it announced")]
    text: Annotated[str, Meta(description="the line typed")]


class ApprovalRequested(Event, tag="approval-requested"):
    """The agent asks for permission (`GET /approvals` lists it until it is answered)."""

    id: str
    tool: str
    summary: str
    kind: ApprovalKindField = "tool"


class ApprovalResolved(Event, tag="approval-resolved"):
    """A permission request was answered, or withdrawn unanswered (`decision` and `by` null,
    `reason` says why: the turn was interrupted, the CLI exited, a resleeve). One the policy
    decided at once was never listed: this event (`by: "policy"`, `rule`) is its only one."""

    id: str
    decision: DecisionField | None
    by: DecidedByField | None
    reason: str | UnsetType = UNSET
    kind: ApprovalKindField = "tool"
    tool: str | UnsetType = UNSET
    summary: str | UnsetType = UNSET
    rule: Annotated[str, Meta(description="the policy rule that decided")] | UnsetType = UNSET


class EgressDenied(Event, tag="egress-denied"):
    """The CLI tried to reach a host off the egress allowlist (one event per host and `how` a
    minute; every attempt is counted in /status and /metrics)."""

    host: Annotated[str, Meta(description="the host name asked for, or the address")]
    port: Annotated[int, Meta(ge=0, le=65535)]
    how: EgressHowField
    reason: (
        Annotated[
            str,
            Meta(
                description="with SIDECAR_EGRESS_ASK: why this one was not held for an "
                "approval (a connection around the proxy cannot be held safely)"
            ),
        ]
        | UnsetType
    ) = UNSET


class EgressChanged(Event, tag="egress-changed"):
    """The allowlist changed while the sleeve runs: `PATCH /egress` (`api`), an egress
    approval allowed with `remember` (`approval`), the allow file read again on SIGHUP
    (`reload`)."""

    added: list[str]
    removed: list[str]
    by: Literal["api", "approval", "reload"]
    allow: Annotated[list[str], Meta(description="the whole list after the change")]
    closed: Annotated[int, Meta(ge=0, description="open connections closed by the change")] = 0


class PolicyChanged(Event, tag="policy-changed"):
    """The policy file was read again (SIGHUP): the new rules apply (`error` null), or it was
    refused and the policy before it stays (`error` says why)."""

    file: str
    rules: Annotated[int, Meta(ge=0, description="rules in force now")]
    error: str | None = None


class ScreenResized(Event, tag="screen-resized"):
    """The CLI's screen changed size (`PUT /screen/size`, or tmux's own): a viewer fits its
    terminal to it."""

    cols: Annotated[int, Meta(ge=1)]
    rows: Annotated[int, Meta(ge=1)]


class UsageEvent(Event, tag="usage"):
    """One model request of the agent, as its CLI reported it (`/status` `usage` sums them)."""

    cli: str
    model: str
    input_tokens: Annotated[int, Meta(ge=0)]
    output_tokens: Annotated[int, Meta(ge=0)]
    cache_read_tokens: Annotated[int, Meta(ge=0)]
    cache_creation_tokens: Annotated[int, Meta(ge=0)]
    cost_usd: Annotated[float, Meta(ge=0)]
    cost_from: Annotated[
        Literal["cli", "prices", "unknown"],
        Meta(
            description="`cli`: the CLI's own figure; `prices`: the sidecar's pinned price "
            "table; `unknown`: a model the table does not know (counted as 0)"
        ),
    ]


class BudgetEvent(Event, tag="budget"):
    """The sleeve's spending reached 80 % of a limit (`warning`) or the limit (`exceeded`:
    approvals are denied, the turn was interrupted, the agent waits for `PATCH /budget`)."""

    level: Literal["warning", "exceeded"]
    message: Annotated[str, Meta(description="one sentence for a person")]
    spent_usd: Annotated[float, Meta(ge=0)]
    spent_tokens: Annotated[int, Meta(ge=0)]
    usd: Annotated[float | None, Meta(description="the limit in USD")]
    tokens: Annotated[int | None, Meta(description="the limit in tokens")]


class NotificationEvent(Event, tag="notification"):
    """A notification was handed to the channels (`sent`), held back (`suppressed`: `why` says
    `cooldown`, `typing` or `over`), or withdrawn (no longer true: the approval was answered)."""

    id: str
    event: NotifyKind
    outcome: Literal["sent", "suppressed", "withdrawn"]
    approval: Annotated[str | None, Meta(description="the approval it is about")] = None
    why: str | UnsetType = UNSET
    channels: list[ChannelName] = field(default_factory=list)


AnyEvent = (
    Heartbeat
    | SidecarRestart
    | ProgressUpdate
    | Completion
    | CliExit
    | Resleeve
    | AgentStateEvent
    | InboxNotified
    | ApprovalRequested
    | ApprovalResolved
    | EgressDenied
    | EgressChanged
    | PolicyChanged
    | ScreenResized
    | UsageEvent
    | BudgetEvent
    | NotificationEvent
    | ErrorEvent
)
