"""The OpenAPI 3.0.3 description of the sidecar's HTTP API, served at `GET /openapi.json`.

Built as plain data (no framework introspection) so it stays JSON-serialisable and testable;
the only runtime input is the list of CLI names, which becomes the enum of `POST /resleeve`.
"""

from __future__ import annotations

from typing import Any

from sidecar import __version__

__all__ = ["MESSAGE_TYPES", "STATUS_VALUES", "openapi_spec"]

OPENAPI_VERSION = "3.0.3"
MESSAGE_TYPES = ("task", "question", "response", "milestone", "directive", "blocked")
MAX_NAME_CHARS = 256  # longest `from` / `to` / `thread` accepted by POST /inbox
STATUS_VALUES = ("idle", "working", "blocked", "done", "killed", "unknown")
EVENT_TYPES = ("progress-update", "completion", "cli-exit", "resleeve", "error", "heartbeat")

JSON = "application/json"
NDJSON = "application/x-ndjson"
HTML = "text/html"

AUTH_TEXT = """\
When `SIDECAR_TOKEN` is set, every route but `/health` needs the token, given as
`Authorization: Bearer <token>`. `SIDECAR_VIEW_TOKEN` is a read-only token: it is accepted on
GET routes (the terminal is shown but input and resize frames are dropped) and answers 403 on
every other method. Browsers may pass the token once as `?token=<token>`; the answer then sets an
HttpOnly cookie `sidecar_token` that carries it on later requests, including the WebSocket.
With no token configured, no route asks for one."""

API_TEXT = f"""\
HTTP API of a sleeve sidecar: the PID-1 supervisor that runs an AI coding CLI in tmux inside a
container and exposes its state, messages and terminal.

All JSON answers may gain fields in later versions; clients must ignore fields they do not know.
Errors are always `{{"error": "<message>"}}`: 400 bad request body, 401 missing or wrong token,
403 view token on a write, 404 unknown route, 405 wrong method (with `Allow`), 409 conflict,
413 request body too large, 503 a part (ttyd) is not running.

{AUTH_TEXT}"""


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _responses(ok: dict[str, dict[str, Any]], *errors: int) -> dict[str, Any]:
    """Success answers plus the named error answers; `default` covers the rest (404/405/500)."""
    out: dict[str, Any] = dict(ok)
    for code in errors:
        out[str(code)] = {"$ref": f"#/components/responses/E{code}"}
    out["default"] = {"$ref": "#/components/responses/Error"}
    return out


def _body(schema: dict[str, Any], *, required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {JSON: {"schema": schema}}}


def _string_list(description: str) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "description": description}


def _nullable(type_: str, description: str, **extra: Any) -> dict[str, Any]:
    return {"type": type_, "nullable": True, "description": description, **extra}


def _one_line(description: str) -> dict[str, Any]:
    # The header fields of a message file: one line of printable text.
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_CHARS,
        "pattern": "^[^\\x00-\\x1f\\x7f\\x85\\u2028\\u2029\\ufeff]*$",
        "description": description,
    }


def _schemas(cli_names: list[str]) -> dict[str, Any]:
    cli: dict[str, Any] = {"type": "string", "description": "CLI name from the registry"}
    if cli_names:  # JSON Schema forbids an empty enum
        cli["enum"] = list(cli_names)
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string", "description": "what went wrong"}},
            "additionalProperties": True,
        },
        "Health": {
            "type": "object",
            "required": ["status", "uptime"],
            "properties": {
                "status": {
                    "type": "string",
                    "enum": ["healthy", "degraded"],
                    "description": "`degraded` while the CLI is not running",
                },
                "uptime": {"type": "integer", "minimum": 0, "description": "seconds"},
            },
            "additionalProperties": True,
        },
        "Progress": {
            "type": "object",
            "required": ["total", "completed"],
            "properties": {
                "total": {"type": "integer", "minimum": 0},
                "completed": {"type": "integer", "minimum": 0},
            },
            "additionalProperties": True,
        },
        "Status": {
            "type": "object",
            "required": [
                "sleeve_id",
                "status",
                "current_task",
                "progress",
                "blockers",
                "cli",
                "cli_pid",
                "cli_running",
                "last_activity",
                "health",
                "repo",
                "warnings",
            ],
            "properties": {
                "sleeve_id": {"type": "string", "description": "`SLEEVE_NAME`"},
                "status": {
                    "type": "string",
                    "enum": list(STATUS_VALUES),
                    "description": "from `.cstack/CURRENT.md`; `unknown` when it is missing "
                    "or unreadable",
                },
                "current_task": _nullable("string", "the `## Task` section"),
                "progress": _ref("Progress"),
                "blockers": _string_list("items under `## Blockers`; `(none)` gives []"),
                "next_steps": _string_list("items under `## Next Steps`"),
                "cli": {"type": "string", "description": "name of the CLI in the sleeve"},
                "cli_pid": _nullable("integer", "pid of the CLI while it runs"),
                "cli_running": {"type": "boolean"},
                "cli_state": {"type": "string", "description": "supervisor state of the CLI"},
                "cli_exit_code": _nullable("integer", "exit code of the last CLI run"),
                "resleeving": {"type": "boolean", "description": "a resleeve is in progress"},
                "ttyd_state": {"type": "string", "description": "supervisor state of ttyd"},
                "last_activity": _nullable(
                    "string", "last change of CURRENT.md or terminal output", format="date-time"
                ),
                "health": {"type": "string", "enum": ["healthy", "degraded"]},
                "repo": _nullable("string", "`SLEEVE_REPO`"),
                "warnings": _string_list("problems worth a look (unreadable files, ...)"),
            },
            "additionalProperties": True,
        },
        "Message": {
            "type": "object",
            "description": "A message as read from its file. A hand-written file may lack "
            "`from`, `type` or `time` (null here) or use another type; such messages are "
            "passed through and named in `warnings`.",
            "required": ["id", "from", "to", "thread", "type", "content", "timestamp"],
            "properties": {
                "id": {"type": "string"},
                "from": _nullable("string", "sender"),
                "to": _nullable("string", "recipient; null: the envoy decides"),
                "thread": _nullable("string", "conversation this message belongs to"),
                "type": _nullable("string", f"one of {', '.join(MESSAGE_TYPES)}"),
                "content": {"type": "string", "description": "markdown body"},
                "timestamp": _nullable("string", "the message's `time`", format="date-time"),
            },
            "additionalProperties": True,
        },
        "MessageList": {
            "type": "object",
            "required": ["messages"],
            "properties": {
                "messages": {"type": "array", "items": _ref("Message")},
                "warnings": _string_list("problems in the message file (line N: ...)"),
                "truncated": {
                    "type": "boolean",
                    "description": "the file is over the read limit; only its start was read",
                },
            },
            "additionalProperties": True,
        },
        "NewMessage": {
            "type": "object",
            "required": ["from", "type", "content"],
            "properties": {
                "from": _one_line("sender"),
                "type": {"type": "string", "enum": list(MESSAGE_TYPES)},
                "content": {"type": "string"},
                "to": {**_one_line("recipient"), "nullable": True},
                "thread": {**_one_line("conversation id"), "nullable": True},
            },
            "additionalProperties": False,
        },
        "MessageCreated": {
            "type": "object",
            "required": ["id"],
            "properties": {
                "id": {"type": "string", "description": "id given to the message"},
                "timestamp": {"type": "string", "format": "date-time"},
            },
            "additionalProperties": True,
        },
        "AckRequest": {
            "type": "object",
            "required": ["ids"],
            "properties": {"ids": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False,
        },
        "AckResult": {
            "type": "object",
            "required": ["removed"],
            "properties": {
                "removed": {"type": "integer", "minimum": 0},
                "unknown": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "ids that were not in the outbox",
                },
            },
            "additionalProperties": True,
        },
        "ResleeveRequest": {
            "type": "object",
            "properties": {"cli": cli},
            "additionalProperties": False,
        },
        "ResleeveAccepted": {
            "type": "object",
            "required": ["status", "cli"],
            "properties": {
                "status": {"type": "string", "enum": ["resleeving"]},
                "cli": {"type": "string"},
            },
            "additionalProperties": True,
        },
        "Event": {
            "type": "object",
            "description": "One line of `/events`. `progress-update` carries the new status, "
            "task and progress; `completion` the finished `task`; `cli-exit` `cli`, "
            "`exit_code` and `pid`; `resleeve` `phase`, `cli` and `previous`; `error` a "
            "`message`; `heartbeat` (every 15 s of silence) only the time.",
            "required": ["type", "time"],
            "properties": {
                "type": {"type": "string", "enum": list(EVENT_TYPES)},
                "time": {"type": "string", "format": "date-time"},
            },
            "additionalProperties": True,
        },
    }


_ERRORS = {
    400: "bad request: malformed JSON or invalid fields",
    401: "missing or wrong token",
    403: "the view token is read-only, or a browser request from another origin (or, without a "
    "token, from a page served by name rather than by address)",
    409: "conflict: a resleeve is already in progress or the sidecar is shutting down; for "
    "messages: `.needlecast/` or a message file is a symlink leading out of the workspace",
    507: "no room: the mailbox is full (ack messages) or the disk is",
    413: "request body too large",
    503: "the terminal (ttyd) is not available; retry after `Retry-After` seconds",
}


def _components(cli_names: list[str]) -> dict[str, Any]:
    responses: dict[str, Any] = {
        f"E{code}": _json(_ref("Error"), text) for code, text in _ERRORS.items()
    }
    responses["Error"] = _json(_ref("Error"), "any other error (404, 405, 500)")
    return {
        "schemas": _schemas(cli_names),
        "responses": responses,
        "securitySchemes": {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "`SIDECAR_TOKEN` (full access) or `SIDECAR_VIEW_TOKEN` "
                "(read-only: GET routes, a terminal that cannot type)",
            },
            "tokenQuery": {
                "type": "apiKey",
                "in": "query",
                "name": "token",
                "description": "for browsers: the same tokens; the answer sets the cookie",
            },
            "tokenCookie": {
                "type": "apiKey",
                "in": "cookie",
                "name": "sidecar_token",
                "description": "set by the sidecar after a `?token=` request",
            },
        },
    }


def _op(
    op_id: str, tag: str, summary: str, responses: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    return {
        "operationId": op_id,
        "tags": [tag],
        "summary": summary,
        "responses": responses,
        **extra,
    }


def _html(description: str) -> dict[str, Any]:
    return {"description": description, "content": {HTML: {"schema": {"type": "string"}}}}


_UPGRADE = {
    "101": {
        "description": "WebSocket upgrade (`Upgrade: websocket`, subprotocol `tty`), relayed "
        "frame for frame to ttyd; with the view token input and resize frames are dropped"
    }
}


def _paths() -> dict[str, Any]:
    terminal_text = (
        "ttyd's web terminal, proxied (ttyd itself listens on loopback only). A WebSocket "
        "upgrade on `/terminal` or `/terminal/ws` with subprotocol `tty` is relayed to ttyd. "
        "A plain GET of `/terminal` redirects to `/terminal/`, whose relative URLs ttyd's page "
        'needs; `/terminal/token` answers `{"token": ""}` (the proxy authenticates to '
        "ttyd itself) and other paths below `/terminal/` are 404."
    )
    return {
        "/health": {
            "get": _op(
                "getHealth",
                "status",
                "Liveness: 200 whenever the sidecar runs",
                _responses({"200": _json(_ref("Health"), "sidecar health")}),
                security=[],
                description="Never needs a token; `degraded` means the CLI is not running.",
            )
        },
        "/status": {
            "get": _op(
                "getStatus",
                "status",
                "The sleeve's state: CURRENT.md, the CLI process and health",
                _responses({"200": _json(_ref("Status"), "current state")}, 401),
            )
        },
        "/outbox": {
            "get": _op(
                "getOutbox",
                "messages",
                "Messages the sleeve wrote for the envoy (`.needlecast/outbox.md`)",
                _responses({"200": _json(_ref("MessageList"), "the outbox")}, 401, 409),
            )
        },
        "/outbox/ack": {
            "post": _op(
                "ackOutbox",
                "messages",
                "Remove delivered messages from the outbox",
                _responses({"200": _json(_ref("AckResult"), "removed")}, 400, 401, 403, 409, 413),
                description="Removes exactly the given ids; messages appended meanwhile stay.",
                requestBody=_body(_ref("AckRequest")),
            )
        },
        "/inbox": {
            "get": _op(
                "getInbox",
                "messages",
                "Messages waiting for the sleeve (`.needlecast/inbox.md`)",
                _responses({"200": _json(_ref("MessageList"), "the inbox")}, 401, 409),
            ),
            "post": _op(
                "postInbox",
                "messages",
                "Deliver a message to the sleeve",
                _responses(
                    {"201": _json(_ref("MessageCreated"), "stored")}, 400, 401, 403, 409, 413, 507
                ),
                description="The sidecar fills in `id` and the time.",
                requestBody=_body(_ref("NewMessage")),
            ),
        },
        "/resleeve": {
            "post": _op(
                "resleeve",
                "control",
                "Restart the CLI, optionally as another CLI",
                _responses(
                    {"202": _json(_ref("ResleeveAccepted"), "resleeve started")},
                    400,
                    401,
                    403,
                    409,
                    413,
                ),
                description="The body is optional; without `cli` the current CLI is stopped and "
                "started again (with its resume command, if it has one). Unknown fields are a "
                "400. Progress is reported on `/events` (`resleeve`).",
                requestBody=_body(_ref("ResleeveRequest"), required=False),
            )
        },
        "/events": {
            "get": _op(
                "getEvents",
                "status",
                "Event stream: one JSON object per line",
                _responses(
                    {
                        "200": {
                            "description": "NDJSON stream that stays open; see `Event`",
                            "content": {NDJSON: {"schema": _ref("Event")}},
                        }
                    },
                    401,
                ),
            )
        },
        "/terminal": {
            "get": _op(
                "getTerminal",
                "terminal",
                "Web terminal (ttyd) or its WebSocket",
                _responses(
                    {
                        **_UPGRADE,
                        "200": _html("ttyd's page"),
                        "302": {"description": "to `/terminal/`"},
                    },
                    401,
                    503,
                ),
                description=terminal_text,
            )
        },
        "/terminal/": {
            "get": _op(
                "getTerminalPage",
                "terminal",
                "ttyd's page",
                _responses({**_UPGRADE, "200": _html("ttyd's page")}, 401, 503),
                description=terminal_text,
            )
        },
        "/terminal/token": {
            "get": _op(
                "getTerminalToken",
                "terminal",
                "The token ttyd's page puts into its init message (always empty here)",
                _responses(
                    {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["token"],
                                "properties": {"token": {"type": "string", "maxLength": 0}},
                            },
                            "an empty token",
                        )
                    },
                    401,
                ),
                description=terminal_text,
            )
        },
        "/terminal/ws": {
            "get": _op(
                "getTerminalSocket",
                "terminal",
                "The terminal WebSocket (subprotocol `tty`)",
                _responses(_UPGRADE, 400, 401, 503),
                description="400 without `Upgrade: websocket`.",
            )
        },
        "/": {
            "get": _op(
                "getDashboard",
                "meta",
                "Dashboard page: status, progress, blockers, outbox, terminal",
                _responses({"200": _html("the dashboard")}, 401),
                description="Open it once as `/?token=<token>` when a token is configured.",
            )
        },
        "/openapi.json": {
            "get": _op(
                "getOpenapi",
                "meta",
                "This description",
                _responses({"200": _json({"type": "object"}, "OpenAPI 3 document")}, 401),
            )
        },
    }


def openapi_spec(*, cli_names: list[str]) -> dict[str, Any]:
    """The OpenAPI document; `cli_names` (the registry) become the `cli` enum of /resleeve."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "sleeve sidecar",
            "version": __version__,
            "description": API_TEXT,
            "license": {"name": "MIT"},
        },
        "tags": [
            {"name": "status", "description": "health, state and events"},
            {"name": "messages", "description": "inbox and outbox (`.needlecast/`)"},
            {"name": "control", "description": "resleeve"},
            {"name": "terminal", "description": "the CLI's terminal (ttyd)"},
            {"name": "meta", "description": "dashboard and this document"},
        ],
        "security": [{"bearer": []}, {"tokenQuery": []}, {"tokenCookie": []}],
        "paths": _paths(),
        "components": _components(cli_names),
    }
