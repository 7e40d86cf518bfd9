"""The OpenAPI 3.1 document served at `GET /openapi.json`, generated from the route table (each
route module's `Operation`s) and the typed shapes (`sidecar.core.shapes`, `.event_shapes`), so
that the server and its description cannot drift. Built once per app: it describes this sidecar
(its CLIs, its tokens).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

import msgspec

from sidecar import __version__
from sidecar.core import event_shapes, shapes

OPENAPI_VERSION = "3.1.0"
JSON = "application/json"
NDJSON = "application/x-ndjson"
HTML = "text/html"
REF = "#/components/schemas/{name}"

AUTH_TEXT = """\
When `SIDECAR_TOKEN` is set, every route but `/health` needs the token, given as
`Authorization: Bearer <token>`. `SIDECAR_VIEW_TOKEN` is a read-only token: it is accepted on
GET routes (the terminal is shown but input and resize frames are dropped) and answers 403 on
every other method. Browsers may pass the token once as `?token=<token>`; the answer then sets an
HttpOnly cookie `sidecar_token` that carries it on later requests, including the WebSocket.
With no token configured, no route asks for one (this document then lists no security)."""

API_TEXT = f"""\
HTTP API of a sleeve sidecar: the PID-1 supervisor that runs an AI coding CLI in tmux inside a
container and exposes its state, messages and terminal.

All JSON answers may gain fields in later versions; clients must ignore fields they do not know.
Errors are always `{{"error": "<message>"}}`: 400 bad request body (unknown fields, wrong types
and nulls included; the message names the field), 401 missing or wrong token, 403 view token on
a write or a browser request from another origin, 404 unknown route, 405 wrong method (with
`Allow`), 409 conflict, 413 request body too large, 503 a part (ttyd, tmux) is not available.

{AUTH_TEXT}"""

ERRORS = {
    400: "bad request: malformed JSON, unknown fields, wrong types or values",
    401: "missing or wrong token",
    403: "the view token is read-only, or a browser request from another origin (or, without a "
    "token, from a page served by name rather than by address)",
    404: "no such thing (for an approval: no request of that id is waiting)",
    409: "conflict: the state does not allow it now (see the message; an approval answered "
    "already also names `decision` and `by`)",
    410: "gone: a one-tap link that worked once no longer does",
    413: "request body too large",
    503: "a part is not available now (the terminal's ttyd; tmux, for the screen); retry after "
    "`Retry-After` seconds",
    507: "no room: the mailbox is full (ack messages) or the disk is",
}

TAGS = {
    "status": "health, state and events",
    "messages": "inbox and outbox (`.needlecast/`)",
    "control": "resleeve and typing into the CLI",
    "terminal": "the CLI's terminal (ttyd)",
    "notify": "notifications: one-tap links, Web Push, a test",
    "meta": "dashboard and this document",
}


# What the sidecar POSTs to SIDECAR_NOTIFY_WEBHOOK (OpenAPI 3.1's `webhooks`).
WEBHOOK = {
    "post": {
        "operationId": "notification",
        "tags": ["notify"],
        "summary": "A notification, POSTed to SIDECAR_NOTIFY_WEBHOOK",
        "description": "Signed: `X-Sleeve-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 over "
        '"<t>.<body>">` with the secret in SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE. Any 2xx is '
        "success; a 5xx, a network error or no answer within 10 s is tried again (3 tries in "
        "all), a 4xx or a redirect is not. `X-Sleeve-Delivery` is the notification's id on "
        "every try.",
        "requestBody": {
            "required": True,
            "content": {JSON: {"schema": {"$ref": REF.format(name="WebhookNotification")}}},
        },
        "responses": {"200": {"description": "received"}},
    }
}


@dataclass(frozen=True)
class Media:
    """An answer that is not a typed JSON body: a page, a stream, an upgrade."""

    description: str
    content_type: str | None = None  # None: no body (a redirect, a WebSocket upgrade)
    schema: type | Mapping[str, Any] | None = None  # a shape (JSON Schema from it) or a schema


# An answer's body: a shape (JSON), a Media, or several by content type (negotiated by Accept).
Answered = type | Media | tuple[type | Media, ...]


@dataclass(frozen=True)
class Operation:
    """One route: what aiohttp serves and what the document says about it, in one place."""

    method: str
    path: str
    handler: Callable[..., Awaitable[Any]]
    op_id: str
    tag: str
    summary: str
    answers: Mapping[int, Answered]
    description: str = ""
    body: type[shapes.Request] | None = None
    body_required: bool = True
    errors: tuple[int, ...] = ()
    public: bool = False  # no token needed
    capability: bool = False  # the URL is the credential: no token, no browser checks either
    parameters: tuple[Mapping[str, Any], ...] = ()  # OpenAPI parameter objects (path, header)
    raw_body: Mapping[str, Any] | None = None  # a request body schema not given as a shape
    extra_paths: tuple[str, ...] = field(default=())  # the same operation under other paths


def _schemas(types: Iterable[Any]) -> dict[str, Any]:
    _, components = msgspec.json.schema_components(tuple(types), ref_template=REF)
    return components


def _schema_of(kind: type | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(kind, Mapping):
        return dict(kind)
    return {"$ref": REF.format(name=kind.__name__)}


def _answer(kind: Answered) -> dict[str, Any]:
    if isinstance(kind, tuple):
        parts = [_answer(k) for k in kind]
        content = {t: c for part in parts for t, c in part.get("content", {}).items()}
        return {"description": " / ".join(p["description"] for p in parts), "content": content}
    if isinstance(kind, Media):
        out: dict[str, Any] = {"description": kind.description}
        if kind.content_type is not None:
            schema = {"type": "string"} if kind.schema is None else _schema_of(kind.schema)
            out["content"] = {kind.content_type: {"schema": schema}}
        return out
    return {
        "description": (kind.__doc__ or kind.__name__).strip().splitlines()[0],
        "content": {JSON: {"schema": _schema_of(kind)}},
    }


def _operation(op: Operation, *, secured: bool) -> dict[str, Any]:
    # 403: a browser request from another origin, on any route (and the view token on writes).
    errors = {*op.errors, 403}
    if op.method != "GET":
        errors.add(413)  # any body over the limit
    if secured and not op.public:
        errors.add(401)
    responses: dict[str, Any] = {str(code): _answer(kind) for code, kind in op.answers.items()}
    for code in sorted(errors):
        responses[str(code)] = {"$ref": f"#/components/responses/E{code}"}
    responses["default"] = {"$ref": "#/components/responses/Error"}
    out: dict[str, Any] = {
        "operationId": op.op_id,
        "tags": [op.tag],
        "summary": op.summary,
        "responses": responses,
    }
    if op.description:
        out["description"] = op.description
    if op.parameters:
        out["parameters"] = [dict(p) for p in op.parameters]
    if op.body is not None or op.raw_body is not None:
        schema = _schema_of(op.body) if op.body is not None else dict(op.raw_body or {})
        out["requestBody"] = {"required": op.body_required, "content": {JSON: {"schema": schema}}}
    if secured and op.public:
        out["security"] = []
    return out


def document(
    operations: Iterable[Operation], *, cli_names: Iterable[str], secured: bool
) -> dict[str, Any]:
    """The OpenAPI document for these routes. `cli_names` (the registry) become the enum of
    /resleeve's `cli`; `secured` (a token is set) adds the security schemes and 401s."""
    ops = list(operations)
    used: list[Any] = [shapes.Error, shapes.WebhookNotification, *get_args(event_shapes.AnyEvent)]
    for op in ops:
        if op.body is not None:
            used.append(op.body)
        for answered in op.answers.values():
            for kind in answered if isinstance(answered, tuple) else (answered,):
                if isinstance(kind, Media):
                    if isinstance(kind.schema, type):
                        used.append(kind.schema)
                else:
                    used.append(kind)
    schemas = _schemas(dict.fromkeys(used))
    names = sorted(cli_names)
    if names and "ResleeveRequest" in schemas:  # JSON Schema forbids an empty enum
        schemas["ResleeveRequest"]["properties"]["cli"]["enum"] = names
    if "InputRequest" in schemas:
        # Exactly one of `text`, `keys` and `choice`; `submit` only with `text` (msgspec
        # cannot say it).
        one = ("text", "keys", "choice")
        schemas["InputRequest"]["oneOf"] = [
            {
                "required": [name],
                "not": {
                    "anyOf": [
                        {"required": [other]}
                        for other in (*one, *(("submit",) if name != "text" else ()))
                        if other != name
                    ]
                },
            }
            for name in one
        ]
    schemas["Event"] = {
        "description": "One line of `/events`: the object's `type` tells which.",
        "oneOf": [_schema_of(t) for t in get_args(event_shapes.AnyEvent)],
        "discriminator": {"propertyName": "type"},
    }

    paths: dict[str, dict[str, Any]] = {}
    for op in ops:
        for path in (op.path, *op.extra_paths):
            paths.setdefault(path, {})[op.method.lower()] = _operation(op, secured=secured)

    responses: dict[str, Any] = {
        f"E{code}": {"description": text, "content": {JSON: {"schema": _schema_of(shapes.Error)}}}
        for code, text in ERRORS.items()
    }
    responses["Error"] = {
        "description": "any other error (404, 405, 500)",  # 404 of a route that has no E404
        "content": {JSON: {"schema": _schema_of(shapes.Error)}},
    }
    components: dict[str, Any] = {"schemas": schemas, "responses": responses}
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "sleeve sidecar",
            "version": __version__,
            "description": API_TEXT,
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "tags": [{"name": name, "description": text} for name, text in TAGS.items()],
        "paths": paths,
        "webhooks": {"notification": WEBHOOK},
        "components": components,
    }
    if secured:
        components["securitySchemes"] = {
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
        }
        doc["security"] = [{"bearer": []}, {"tokenQuery": []}, {"tokenCookie": []}]
    return doc
