"""Names and limits the public contract (CONTRACT.md) fixes, each in one place.

Everything else imports them from here: the parsers, the API's typed shapes, the generated
OpenAPI document, the client commands. Standard library only (the launcher imports it too).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Final, Literal, get_args

#: Message types in `.needlecast/*.md` and `POST /inbox`.
MessageType = Literal["task", "question", "response", "milestone", "directive", "blocked"]
MESSAGE_TYPES: Final[tuple[str, ...]] = get_args(MessageType)

#: `status` in /status, from `.cstack/CURRENT.md` (`unknown`: missing or unreadable).
Status = Literal["idle", "working", "blocked", "done", "killed", "unknown"]
STATUS_VALUES: Final[tuple[str, ...]] = get_args(Status)

#: `/health` `status`.
Health = Literal["healthy", "degraded"]

#: Largest request body the API accepts (bytes); past it: 413.
MAX_BODY_BYTES: Final = 256 * 1024
#: Longest `from`, `to`, `thread` of a message (one line of printable text).
MAX_NAME_CHARS: Final = 256


def rfc3339(ts: float | None = None, *, ms: bool = True) -> str:
    """`ts` (seconds since the epoch; None: now) as RFC 3339 UTC time with a Z: the format of
    every time the API gives. With milliseconds; `ms=False`: whole seconds (a message's `time`,
    `last_activity`)."""
    when = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return when.isoformat(timespec="milliseconds" if ms else "seconds").replace("+00:00", "Z")


#: What the agent is doing (`agent.state` in /status, `agent` in /health, `agent-state` events).
AgentStateName = Literal["starting", "working", "waiting", "idle", "exited", "unknown"]
AGENT_STATES: Final[tuple[str, ...]] = get_args(AgentStateName)

#: How the sidecar learns the agent's state (`agent.source` in /status; a CLI's `state` in the
#: registry): the CLI's hooks, its own server's event stream, or its pane's output.
StateSource = Literal["hooks", "events", "activity", "none"]

#: A permission request's answer, who gave it, and how the sidecar learnt of the request and
#: answers it (/approvals, `approval-resolved` events).
Decision = Literal["allow", "deny"]
DecidedBy = Literal["api", "terminal", "timeout", "link", "budget", "policy"]
ApprovalSource = Literal["hooks", "screen", "events", "proxy"]
#: What an approval is about: a permission request of the CLI, or a held request for a host off
#: the egress allowlist.
ApprovalKind = Literal["tool", "egress"]

#: The CLI's network (`egress.mode` in /status), and how a refused attempt was made (`how` of
#: `egress-denied` events).
EgressMode = Literal["open", "allowlist"]
EgressHow = Literal["proxy", "direct", "udp", "ipv6", "raw", "unix"]

#: Key names `POST /input` accepts (`keys`).
InputKey = Literal[
    "Enter", "Escape", "Tab", "BTab", "Up", "Down", "Left", "Right", "Space", "Backspace",
    "C-c", "C-d", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "y", "n",
]  # fmt: skip
INPUT_KEYS: Final[tuple[str, ...]] = get_args(InputKey)
#: Largest `text` of `POST /input`, in bytes of UTF-8.
MAX_INPUT_BYTES: Final = 64 * 1024

#: Defaults of the environment's settings (CONTRACT.md's table; `sidecar.config` reads them).
DEFAULT_PORT: Final = 8080
DEFAULT_HOST: Final = "0.0.0.0"  # noqa: S104 - the container's API is meant to be published
DEFAULT_WORKSPACE: Final = "/workspace"
DEFAULT_STATE_DIR: Final = "/run/sidecar"
#: `SIDECAR_STOP_GRACE`: seconds between SIGTERM and SIGKILL for the CLI's tree.
STOP_GRACE: Final = 5.0
#: Seconds the sidecar's own shutdown may take after the CLI's grace: ttyd (up to 2 s), the tmux
#: server (up to 2 s), CURRENT.md.
SHUTDOWN_MARGIN: Final = 5


def runtime_grace(stop_grace: float = STOP_GRACE) -> int:
    """The stop-grace rule: seconds whatever runs a sleeve gives it between its SIGTERM and its
    SIGKILL (`docker create --stop-timeout`, `sleeve stop` for docker and bwrap, a pod's
    `terminationGracePeriodSeconds` at least, the Helm chart's check of it): the CLI's grace
    (`stop_grace`, SIDECAR_STOP_GRACE) rounded up, and the sidecar's shutdown after it."""
    return math.ceil(stop_grace) + SHUTDOWN_MARGIN


#: `SIDECAR_RECORD_MAX_MB`: the recordings' total size cap, in MiB (oldest removed first).
RECORD_MAX_MB: Final = 200
#: The share of a budget (`SIDECAR_BUDGET_*`) at which a `budget` event warns.
BUDGET_WARN_AT: Final = 0.8

#: The tmux session that hosts the CLI (`sidecar attach` attaches to it).
TMUX_SESSION: Final = "main"
#: The CLI's screen (the session's window), in columns and rows: its size at start, and the
#: bounds of what `PUT /screen/size` makes it (every screen recognizer is tested at both ends).
SCREEN_START: Final = (200, 50)
SCREEN_MIN: Final = (80, 24)
SCREEN_MAX: Final = (250, 60)


def screen_size(cols: int, rows: int) -> tuple[int, int]:
    """`cols` x `rows` brought within SCREEN_MIN..SCREEN_MAX."""
    return (
        min(max(cols, SCREEN_MIN[0]), SCREEN_MAX[0]),
        min(max(rows, SCREEN_MIN[1]), SCREEN_MAX[1]),
    )
