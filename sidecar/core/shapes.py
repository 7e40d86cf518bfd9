"""Every request body and answer of the HTTP API, declared once: bodies are validated on the way
in, answers encoded from these on the way out, and the OpenAPI schemas generated from these by
`sidecar.api.openapi` (the `/events` lines: `sidecar.core.event_shapes`). A new field is one edit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType, field

from sidecar.core.contract import (
    MAX_INPUT_BYTES,
    MAX_NAME_CHARS,
    AgentStateName,
    ApprovalKind,
    ApprovalSource,
    DecidedBy,
    Decision,
    EgressMode,
    Health,
    InputKey,
    StateSource,
    Status,
)
from sidecar.core.states import ProcState

# ---- building blocks ---------------------------------------------------------------------------

Count = Annotated[int, Meta(ge=0)]
Timestamp = Annotated[
    str, Meta(description="RFC 3339 UTC time", extra_json_schema={"format": "date-time"})
]
# A header value of a message file: one line of printable text. The pattern is for the document
# only (as JSON Schema reads it); the API checks values with needlecast's exact rule, whose
# message says what is wrong better than a regex would.
OneLine = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_NAME_CHARS,
        extra_json_schema={"pattern": "^[^\\x00-\\x1f\\x7f\\x85\\u2028\\u2029\\ufeff]*$"},
    ),
]
# Text without the control characters a paste must not carry (tab, LF and CR are allowed).
NO_CONTROLS = "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$"
ProcStateName = Annotated[ProcState, Meta(description="supervisor state of the process")]
AgentStateField = Annotated[AgentStateName, Meta(description="what the agent is doing")]


class Answer(Struct):
    """Base of every JSON answer. Answers may gain fields in later versions: clients ignore
    fields they do not know (the schemas allow additional properties)."""


class Request(Struct, forbid_unknown_fields=True):
    """Base of every request body: unknown fields, wrong types and nulls are a 400."""


# ---- errors ------------------------------------------------------------------------------------


class Error(Answer):
    """Every error answer."""

    error: Annotated[str, Meta(description="what went wrong")]


# ---- status ------------------------------------------------------------------------------------


class ScreenSize(Answer):
    """The CLI's screen (the tmux window it draws in), in columns and rows."""

    cols: Annotated[int, Meta(ge=1)]
    rows: Annotated[int, Meta(ge=1)]


class DialogChoice(Answer):
    """One answer the dialog on screen offers, labelled as the CLI labels it (`POST /input`
    with `choice` gives it). For a permission dialog, what the choice decides."""

    label: str
    decision: Annotated[
        Decision | None, Meta(description="for a permission dialog: allow or deny; else null")
    ] = None
    remember: Annotated[
        bool, Meta(description="for a permission dialog: allow this kind of call from now on")
    ] = False


Access = Annotated[
    Literal["read-write", "read-only"],
    Meta(
        description="what this request's token may do: `read-write` (the API token, or none "
        "is set) types and answers; `read-only` (the view token) only looks"
    ),
]


class HealthAnswer(Answer):
    """Sidecar health (200 whenever the sidecar runs)."""

    status: Annotated[Health, Meta(description="`degraded` while the CLI is not running")]
    uptime: Annotated[int, Meta(ge=0, description="seconds since the sidecar started")]
    agent: AgentStateField


class AgentInfo(Answer):
    """What the agent is doing, and how the sidecar knows."""

    state: AgentStateField
    since: Annotated[Timestamp, Meta(description="when it entered this state")]
    reason: Annotated[
        str | None,
        Meta(
            description="what it waits for (a permission prompt: the tool and its command or "
            "path), or why the state is what it is"
        ),
    ]
    source: Annotated[
        StateSource,
        Meta(
            description="`hooks`: the CLI reports its lifecycle; `events`: the CLI's own "
            "server's event stream (opencode); `activity`: pane output"
        ),
    ]
    session_id: Annotated[str | None, Meta(description="the CLI's conversation id, when known")]
    choices: Annotated[
        list[DialogChoice],
        Meta(description="`waiting` on a dialog the sidecar can read: the answers it offers"),
    ] = field(default_factory=list)


class EgressInfo(Answer):
    """The CLI's network: open, or the egress allowlist (`SIDECAR_EGRESS_ALLOW`)."""

    mode: EgressMode
    allow: Annotated[list[str], Meta(description="the allowed host patterns, as normalised")]
    denied: Annotated[int, Meta(ge=0, description="refused attempts since the supervisor started")]


class EgressAnswer(EgressInfo):
    """The allowlist as the proxy applies it now, and what it did."""

    added: Annotated[
        list[str], Meta(description="patterns added while the sleeve runs (in `allow` too)")
    ]
    allowed: Annotated[
        dict[str, int], Meta(description="connections let through, by the pattern allowing them")
    ]
    asked: Annotated[int, Meta(ge=0, description="requests held for an egress approval")]
    ask: Annotated[float | None, Meta(description="SIDECAR_EGRESS_ASK: seconds a request is held")]


MAX_PATTERNS_CHANGED = 1000


class EgressPatch(Request):
    """Patterns to add to the allowlist and to take off it, in the allowlist's syntax."""

    add: (
        Annotated[list[str], Meta(max_length=MAX_PATTERNS_CHANGED, description="patterns to allow")]
        | UnsetType
    ) = UNSET
    remove: (
        Annotated[
            list[str],
            Meta(
                max_length=MAX_PATTERNS_CHANGED,
                description="patterns to take off (as `allow` lists them); open connections "
                "they allowed are closed",
            ),
        ]
        | UnsetType
    ) = UNSET


class Progress(Answer):
    """The `- [ ]` / `- [x]` items under `## Progress` in CURRENT.md."""

    total: Count
    completed: Count


class StatusAnswer(Answer):
    """The sleeve's state: CURRENT.md, the CLI and ttyd, health."""

    sleeve_id: Annotated[str, Meta(description="`SLEEVE_NAME`")]
    status: Annotated[
        Status,
        Meta(description="from `.cstack/CURRENT.md`; `unknown` when it is missing or unreadable"),
    ]
    current_task: Annotated[str | None, Meta(description="the `## Task` section")]
    progress: Progress
    blockers: Annotated[list[str], Meta(description="items under `## Blockers`; `(none)`: []")]
    next_steps: Annotated[list[str], Meta(description="items under `## Next Steps`")]
    cli: Annotated[str, Meta(description="name of the CLI in the sleeve")]
    cli_pid: Annotated[int | None, Meta(description="pid of the CLI while it runs")]
    cli_running: bool
    cli_state: ProcStateName
    cli_exit_code: Annotated[int | None, Meta(description="exit code of the last CLI run")]
    resleeving: Annotated[bool, Meta(description="a resleeve is in progress")]
    ttyd_state: ProcStateName
    last_activity: Annotated[
        Timestamp | None, Meta(description="last change of CURRENT.md or terminal output")
    ]
    health: Health
    repo: Annotated[str | None, Meta(description="`SLEEVE_REPO`")]
    warnings: Annotated[list[str], Meta(description="problems worth a look")]
    sidecar_restarts: Annotated[
        int, Meta(ge=0, description="supervisor crashes init recovered from (see README)")
    ]
    agent: AgentInfo
    # Always sent; a default, so that the schema does not require it of answers made before it.
    egress: EgressInfo = field(default_factory=lambda: EgressInfo(mode="open", allow=[], denied=0))
    screen: Annotated[ScreenSize | None, Meta(description="the CLI's screen size")] = None
    access: Access = "read-write"
    usage: UsageInfo | None = None  # always sent (see `UsageInfo`)
    notify: NotifyInfo = field(default_factory=lambda: NotifyInfo(channels=[], on=[]))


# ---- control -----------------------------------------------------------------------------------


class ResleeveRequest(Request):
    """Optional: the CLI to start instead of the current one."""

    cli: (
        Annotated[str, Meta(min_length=1, description="CLI name from the registry")] | UnsetType
    ) = UNSET


class ResleeveAccepted(Answer):
    """The resleeve started; `/events` reports its progress."""

    status: Literal["resleeving"]
    cli: str


class InputRequest(Request):
    """Text to paste (then Enter, if `submit`), named keys to press, or a dialog's choice to
    give: exactly one of the three."""

    text: (
        Annotated[
            str,
            Meta(
                max_length=MAX_INPUT_BYTES,
                # For the document; the API checks it itself, with a message saying where.
                extra_json_schema={"pattern": NO_CONTROLS},
                description="typed literally as a paste (bracketed where the CLI enabled it); "
                "at most 64 KiB of UTF-8; tab and newline are the only control characters "
                "allowed (use `keys` for Escape and the like)",
            ),
        ]
        | UnsetType
    ) = UNSET
    submit: (
        Annotated[bool, Meta(description="press Enter after the text (default true)")] | UnsetType
    ) = UNSET
    keys: (
        Annotated[list[InputKey], Meta(min_length=1, max_length=64, description="keys in order")]
        | UnsetType
    ) = UNSET
    choice: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=MAX_NAME_CHARS,
                description="a label of `/status`'s `agent.choices`: the dialog on screen is "
                "looked at again and given that answer with its CLI's own keys",
            ),
        ]
        | UnsetType
    ) = UNSET
    if_state: (
        Annotated[
            list[AgentStateName],
            Meta(description="deliver only if the agent is in one of these states (else 409)"),
        ]
        | UnsetType
    ) = UNSET


class InputAccepted(Answer):
    """The input was handed to the CLI's terminal."""

    delivered: Literal[True]
    agent: Annotated[
        AgentStateName,
        Meta(
            description="the agent's state when the answer was made: for keys that answer a "
            "prompt, after the sidecar saw the state change or gave up waiting (`changed`)"
        ),
    ]
    held: Annotated[
        float,
        Meta(
            ge=0,
            description="seconds the keys were held so that the prompt on screen could "
            "take them (Claude Code ignores keys for a moment after it draws a prompt)",
        ),
    ] = 0.0
    changed: Annotated[
        bool | None,
        Meta(
            description="keys sent while `waiting`: whether the agent left `waiting` within "
            "2 s (false: the prompt may not have taken them); null otherwise"
        ),
    ] = None


# ---- approvals ---------------------------------------------------------------------------------

MAX_APPROVAL_MESSAGE = 2048
DecisionField = Annotated[Decision, Meta(description="allow or deny the request")]
DecidedByField = Annotated[
    DecidedBy,
    Meta(
        description="who answered: the API, a person in the terminal, the timeout policy, a "
        "notification's one-tap link, the budget (`SIDECAR_BUDGET_*` spent), or a rule of the"
        " policy file (`rule` names it)"
    ),
]
ApprovalKindField = Annotated[
    ApprovalKind,
    Meta(
        description="`tool`: a permission request of the CLI; `egress`: a proxied request for "
        "a host off the allowlist, held while it waits (SIDECAR_EGRESS_ASK)"
    ),
]


class ApprovalItem(Struct):
    """A permission request the agent waits on."""

    id: Annotated[str, Meta(description="stable for the request's life")]
    tool: str
    summary: Annotated[
        str,
        Meta(
            description="one printable line: the command, the path, the URL (control, bidi "
            "and zero-width characters removed)"
        ),
    ]
    input: Annotated[
        object,
        Meta(
            description="the tool's arguments as the CLI gave them; for `egress`: host, port, "
            "how, method, and the process that asked (pid, exe, argv, uid) as the kernel "
            "tells it"
        ),
    ]
    since: Timestamp
    source: Annotated[
        ApprovalSource,
        Meta(description="how the sidecar learnt of it and answers it"),
    ]
    kind: ApprovalKindField = "tool"
    rule: Annotated[
        str | None,
        Meta(
            description="the policy rule that sent it to a person (`ask`, or an `allow` "
            "never applied to a dialog on screen)"
        ),
    ] = None


class ApprovalsAnswer(Answer):
    approvals: list[ApprovalItem]


class ApprovalRequest(Request):
    """An answer to one permission request."""

    decision: DecisionField
    message: (
        Annotated[
            str,
            Meta(
                max_length=MAX_APPROVAL_MESSAGE,
                extra_json_schema={"pattern": NO_CONTROLS},
                description="told to the agent on deny (at most 2 KiB; tab and newline are the "
                "only control characters allowed)",
            ),
        ]
        | UnsetType
    ) = UNSET
    remember: (
        Annotated[
            bool,
            Meta(
                description="allow this kind of call for the rest of the session, where the "
                "CLI offers it"
            ),
        ]
        | UnsetType
    ) = UNSET


class ApprovalConflict(Error):
    """409 of `POST /approvals/{id}`: the request was answered already, or withdrawn."""

    id: str
    decision: DecisionField | None
    by: DecidedByField | None
    reason: str | UnsetType = UNSET


class ApprovalDecided(Answer):
    id: str
    decision: DecisionField
    by: DecidedByField


# ---- notifications -----------------------------------------------------------------------------

NotifyKindName = Literal["waiting", "idle", "exited", "budget", "egress", "test"]
NotifyKind = Annotated[
    NotifyKindName,
    Meta(
        description="what happened: `waiting` (a dialog or a permission request, once it lasted "
        "SIDECAR_NOTIFY_DWELL), `idle` (a turn ended), `exited` (the CLI ended or cannot start), "
        "`budget`, `egress` (a request for a host off the allowlist waits), `test`"
    ),
]
ChannelName = Literal["webhook", "ntfy", "webpush"]


class ChannelLast(Answer):
    """The last delivery to a channel."""

    time: Timestamp
    ok: bool
    detail: Annotated[str, Meta(description="the status the channel answered, or what failed")]


class ChannelInfo(Answer):
    """One notification channel (`SIDECAR_NOTIFY_*`)."""

    name: ChannelName
    target: Annotated[
        str, Meta(description="where it goes: scheme and host only (a URL's path may be its key)")
    ]
    sent: Count
    failed: Count
    suppressed: Annotated[
        int, Meta(ge=0, description="notifications held back (cooldown, a person typing)")
    ]
    last: ChannelLast | None
    devices: Annotated[int, Meta(ge=0, description="Web Push: subscribed devices")] | UnsetType = (
        UNSET
    )


class NotifyInfo(Answer):
    """Notifications: the channels and what is sent when (see `docs/notifications.md`)."""

    channels: list[ChannelInfo]
    on: Annotated[list[str], Meta(description="`SIDECAR_NOTIFY_ON`")]
    dwell: Annotated[float, Meta(ge=0, description="`SIDECAR_NOTIFY_DWELL` seconds")] = 5.0
    cooldown: Annotated[float, Meta(ge=0, description="`SIDECAR_NOTIFY_COOLDOWN` seconds")] = 60.0
    links: Annotated[
        bool, Meta(description="approvals carry one-tap links (`SIDECAR_PUBLIC_URL` is set)")
    ] = False


class NotificationActions(Answer):
    """One-tap capability links (`/a/<token>`): each answers its approval once, no token needed."""

    allow: str
    deny: str


class NotificationApproval(Answer):
    """The permission request a `waiting` notification is about."""

    id: str
    kind: Literal["tool", "egress"]
    tool: str
    summary: str
    actions: (
        Annotated[NotificationActions, Meta(description="absent without SIDECAR_PUBLIC_URL")]
        | UnsetType
    ) = UNSET


class NotificationAgent(Answer):
    state: AgentStateField
    reason: str | None


class WebhookNotification(Answer, kw_only=True):
    """The body POSTed to `SIDECAR_NOTIFY_WEBHOOK`, signed in `X-Sleeve-Signature: t=<unix
    seconds>,v1=<hex HMAC-SHA256 over "<t>.<body>">` with the secret in
    `SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE`. A retry sends the same body (same `id`)."""

    type: Literal["notification"] = "notification"
    id: Annotated[str, Meta(description="the notification's id (the same on every channel)")]
    event: NotifyKind
    sleeve_id: str
    agent: NotificationAgent
    approval: NotificationApproval | UnsetType = UNSET
    url: Annotated[str | None, Meta(description="the dashboard, under SIDECAR_PUBLIC_URL")]
    time: Timestamp


class LinkInfo(Answer):
    """What a one-tap link would do (a GET decides nothing)."""

    id: Annotated[str, Meta(description="the permission request's id")]
    decision: Decision
    tool: str
    summary: str
    since: Timestamp


class ChannelResult(Answer):
    channel: ChannelName
    ok: bool
    detail: str


class NotifyTestAnswer(Answer):
    """One test notification was sent to each channel; what each answered."""

    results: list[ChannelResult]


class WebPushInfo(Answer):
    """Whether this sidecar offers Web Push (`SIDECAR_NOTIFY_WEBPUSH=on`)."""

    enabled: bool
    devices: Count


class WebPushKey(Answer):
    """The VAPID public key (`applicationServerKey` of `PushManager.subscribe`)."""

    public_key: Annotated[str, Meta(description="base64url, the uncompressed P-256 point")]


class PushKeys(Request):
    p256dh: Annotated[str, Meta(min_length=1, max_length=256)]
    auth: Annotated[str, Meta(min_length=1, max_length=64)]


class PushSubscription(Request):
    """A browser's push subscription, as `PushSubscription.toJSON()` gives it."""

    endpoint: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=2048,
            pattern="^https?://",
            description="the push service's URL for the device: https (http only on loopback)",
        ),
    ]
    keys: PushKeys
    expirationTime: int | UnsetType | None = UNSET  # the browser's name for it


class PushEndpoint(Request):
    """The subscription to forget, by its endpoint."""

    endpoint: Annotated[str, Meta(min_length=1, max_length=2048)]


class PushStored(Answer):
    devices: Annotated[int, Meta(ge=0, description="devices subscribed now")]


# ---- terminal ----------------------------------------------------------------------------------


class TerminalToken(Answer):
    """The token for ttyd's init message: always empty (the proxy authenticates)."""

    token: Annotated[str, Meta(max_length=0, description="always empty: the proxy authenticates")]


# ---- usage and budget --------------------------------------------------------------------------

Usd = Annotated[float, Meta(ge=0, description="US dollars")]


class TokenCounts(Answer):
    """Tokens and cost of model requests, as the CLI reported them."""

    input_tokens: Count
    output_tokens: Count
    cache_read_tokens: Count
    cache_creation_tokens: Count
    cost_usd: Annotated[
        Usd,
        Meta(
            description="as the CLI computed it; for a CLI that reports none, from the "
            "sidecar's pinned price table (docs: usage)"
        ),
    ]
    requests: Annotated[int, Meta(ge=0, description="model requests counted")]


class RunUsage(TokenCounts):
    """The current CLI run's share (a resleeve, a restart or a heal starts a new run)."""

    cli: str
    started: Timestamp


class BudgetInfo(Answer):
    """The sleeve's spending limit (`SIDECAR_BUDGET_*`, changed by `PATCH /budget`)."""

    usd: Annotated[float, Meta(gt=0, description="the limit in USD; null: none")] | None
    tokens: Annotated[int, Meta(gt=0, description="the limit in tokens; null: none")] | None
    spent_usd: Usd
    spent_tokens: Annotated[
        int, Meta(ge=0, description="input, output, cache read and cache creation tokens")
    ]
    state: Annotated[
        Literal["none", "ok", "warning", "exceeded"],
        Meta(
            description="`none`: no limit; `warning`: 80 % or more of a limit spent; "
            "`exceeded`: a limit reached (approvals are denied, `/input` text answers 409)"
        ),
    ]


class UsageInfo(TokenCounts):
    """What the agent spent since the sidecar started (surviving supervisor crashes and
    resleeves), from the CLI's own reports."""

    by_model: Annotated[dict[str, TokenCounts], Meta(description="the same, per model")]
    since: Annotated[Timestamp, Meta(description="when counting began")]
    reporting: Annotated[
        bool,
        Meta(
            description="whether the running CLI reports its usage to the sidecar (false: "
            "a CLI whose usage the sidecar cannot read; nothing it spends is counted)"
        ),
    ]
    run: RunUsage | None
    budget: BudgetInfo


class BudgetRequest(Request):
    """New limits: a number sets one, null clears it, a field left out stays as it is."""

    usd: Annotated[float, Meta(gt=0, le=1000000000.0, description="USD")] | UnsetType | None = UNSET
    tokens: Annotated[int, Meta(gt=0, le=10**15, description="tokens")] | UnsetType | None = UNSET


class OtlpAnswer(Answer):
    """An OTLP/HTTP export's answer (`ExportLogsServiceResponse`): the whole request was taken."""

    partial_success: dict[str, int | str] = field(name="partialSuccess")


# ---- recordings --------------------------------------------------------------------------------


class RecordingItem(Answer):
    """One recording: an asciicast v2 file of one CLI run."""

    id: Annotated[str, Meta(description="its name in `GET /recordings/{id}`")]
    cli: str
    started: Timestamp
    ended: Annotated[Timestamp | None, Meta(description="null while the run goes on")]
    bytes: Annotated[int, Meta(ge=0, description="the file's size")]
    markers: Annotated[int, Meta(ge=0, description='its `"m"` events')]


class RecordingsAnswer(Answer):
    """The recordings kept, oldest first."""

    recordings: list[RecordingItem]
