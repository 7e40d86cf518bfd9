"""The HTTP API: `create_app()` wires the route table, auth and JSON errors around a running
Supervisor, and builds the OpenAPI document from the same table. This is the one place where
errors become HTTP statuses (`error_answer`).
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import ClientConnectionResetError, typedefs, web
from msgspec import UnsetType

from sidecar.agent import approvals
from sidecar.agent.input_delivery import NotRunning, StateMismatch
from sidecar.api import errorpage, httpio, reference, reference_pages
from sidecar.api.agent import HookRefused, agent_operations
from sidecar.api.approvals import approval_conflict, approval_operations
from sidecar.api.audit import audit_operation
from sidecar.api.egress import egress_operations
from sidecar.api.events import events_operation
from sidecar.api.guard import make_guard
from sidecar.api.httpio import BadRequest, error
from sidecar.api.links import link_operations
from sidecar.api.messages import MAILBOXES, message_operations
from sidecar.api.metrics import Metrics, RequestCounter
from sidecar.api.notify import WebPushOff, notify_operations
from sidecar.api.openapi import HTML, Media, Operation, document
from sidecar.api.recordings import PlayerMissing, recording_operations
from sidecar.api.screen import NoScreen, screen_operations
from sidecar.api.status import status_operations
from sidecar.api.terminal import terminal_operations
from sidecar.api.usage import TelemetryRefused, TelemetryTooLarge, usage_operations
from sidecar.core.contract import MAX_BODY_BYTES
from sidecar.core.shapes import ResleeveAccepted, ResleeveRequest
from sidecar.egress.service import NoAllowlist
from sidecar.pane.protocol import ControlError
from sidecar.pane.send import DeliveryError, InputError
from sidecar.process.resleeve import ResleeveBusy, UnknownCLI
from sidecar.process.supervisor import Supervisor
from sidecar.record.store import NoRecording
from sidecar.workspace import mailbox

log = logging.getLogger(__name__)

SUPERVISOR = web.AppKey("supervisor", Supervisor)
OPENAPI = web.AppKey("openapi", bytes)  # the document, encoded once


class ApiPage:
    """`GET /api`'s page, rendered from the encoded document on its first request: most
    sidecars are never asked for it, rendering takes ~20 ms, and the decoded document is not
    kept (it would cost memory every sidecar pays)."""

    def __init__(self, document: bytes) -> None:
        self._document = document
        self._html: bytes | None = None

    def html(self) -> bytes:
        if self._html is None:
            spec = json.loads(self._document)
            self._html = reference_pages.page(reference.read(spec)).encode()
        return self._html


API_PAGE = web.AppKey("api_page", ApiPage)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ---- middlewares ---------------------------------------------------------------------------


WORKSPACE_STATE_ERRORS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR}
)


# Errors whose message is the answer. An unsafe path: the workspace is set up so that writing
# would leave it, a state problem (409), not the client's fault and not transient either.
CLIENT_ERRORS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    ((BadRequest, UnknownCLI, InputError), 400),
    (TelemetryRefused, 401),
    (HookRefused, 403),
    ((approvals.NotFound, NoRecording, PlayerMissing, WebPushOff), 404),
    (TelemetryTooLarge, 413),
    (
        (
            ResleeveBusy,
            NotRunning,
            StateMismatch,
            DeliveryError,
            NoScreen,
            NoAllowlist,
            mailbox.UnsafePathError,
        ),
        409,
    ),
)


def error_answer(request: web.Request, exc: Exception) -> web.Response:
    """The answer to what a handler (or the framework, or a layer below) raised: errors become
    statuses here, and only here; every one answers `{"error": ...}`. What is not an error to
    answer (a redirect, a client gone away) is raised again."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        message = (
            exc.reason if exc.text is None or exc.text.startswith(f"{exc.status}:") else exc.text
        )
        if exc.status == 413:
            message = f"request body too large (limit {MAX_BODY_BYTES} bytes)"
        return error(exc.status, message, **headers)
    for kinds, status in CLIENT_ERRORS:
        if isinstance(exc, kinds):
            return error(status, str(exc))
    if isinstance(exc, approvals.AlreadyAnswered):
        return httpio.answer(approval_conflict(exc), 409)
    if isinstance(exc, ControlError):  # tmux cannot be asked now (restarting, a heal)
        return error(503, f"screen unavailable: {exc}", **{"Retry-After": "1"})
    if isinstance(exc, mailbox.MailboxFullError):
        return error(507, f"{exc}; ack messages to make room")
    if isinstance(exc, ConnectionError | ClientConnectionResetError):
        raise exc  # the client went away: nobody to answer
    if isinstance(exc, OSError):  # a file the route needs (a message file): disk, permissions
        log.warning("%s %s: file I/O failed: %s", request.method, request.path, exc)
        return _file_error(exc)
    # A bug: logged with its traceback, answered as JSON like every error.
    log.error("%s %s failed", request.method, request.path, exc_info=exc)
    return error(500, "internal error (the sidecar's log has the details)")


def _file_error(exc: OSError) -> web.Response:
    if exc.errno in WORKSPACE_STATE_ERRORS:
        # The workspace as it is set up refuses it (a read-only file or folder, a file where a
        # folder belongs): a state to fix there, not the client's fault, and not transient.
        return error(409, f"the workspace refuses it: {exc.strerror} ({exc.filename})")
    status = 507 if exc.errno == errno.ENOSPC else 500
    return error(status, f"file I/O failed: {exc.strerror}")


def make_answers(requests: RequestCounter | None = None) -> typedefs.Middleware:
    """The outermost middleware: every answer leaves through it. Errors become statuses
    (`error_answer`) and each answer is counted for /metrics. (Counting here, not in an
    `on_response_prepare` hook: any receiver on that signal cost ~7 us per request here,
    a fifth of a whole hello-world request.)"""

    @web.middleware
    async def answers(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except Exception as exc:
            response = error_answer(request, exc)
        if errorpage.wanted(request, response):
            assert isinstance(response, web.Response)
            response = errorpage.page(request, response)  # a person's browser: words
        if requests is not None:
            requests.count(request, response)
        return response

    return answers


# ---- routes ----------------------------------------------------------------------------------


async def resleeve(request: web.Request) -> web.Response:
    body = await httpio.read_optional_body(request, ResleeveRequest)
    name = None if body is None or isinstance(body.cli, UnsetType) else body.cli
    chosen, _ = request.app[SUPERVISOR].begin_resleeve(name)
    return httpio.answer(ResleeveAccepted(status="resleeving", cli=chosen), status=202)


async def openapi(request: web.Request) -> web.Response:
    return httpio.raw_answer(request.app[OPENAPI])


async def api_page(request: web.Request) -> web.Response:
    return web.Response(
        body=request.app[API_PAGE].html(), content_type="text/html", charset="utf-8"
    )


async def dashboard(request: web.Request) -> web.Response:
    page = resources.files("sidecar.api").joinpath("static/dashboard.html").read_bytes()
    return web.Response(
        body=page, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-store"}
    )


def resleeve_operation() -> Operation:
    return Operation(
        "POST",
        "/resleeve",
        resleeve,
        "resleeve",
        "control",
        "Restart the CLI, optionally as another CLI",
        {202: ResleeveAccepted},
        description="The body is optional; without `cli` the current CLI is stopped and "
        "started again (with its resume command, if it has one). 400: an unknown CLI (the "
        "message lists the known ones); 409: a resleeve is already in progress, or the "
        "sidecar is starting (or taking over after a restart) or shutting down. Progress is "
        "reported on `/events` (`resleeve`).",
        body=ResleeveRequest,
        body_required=False,
        errors=(400, 409),
    )


def page_operations() -> list[Operation]:
    return [
        Operation(
            "GET",
            "/",
            dashboard,
            "getDashboard",
            "meta",
            "Dashboard page: status, progress, blockers, outbox, terminal",
            {200: Media("the dashboard", HTML)},
            description="Open it once as `/?token=<token>` when a token is configured.",
        ),
        Operation(
            "GET",
            "/openapi.json",
            openapi,
            "getOpenapi",
            "meta",
            "This description",
            {200: Media("OpenAPI 3.1 document", httpio.JSON, {"type": "object"})},
        ),
        Operation(
            "GET",
            "/api",
            api_page,
            "getApiReference",
            "meta",
            "This description as a web page: every route, its answers and the shapes",
            {200: Media("the HTTP API reference, rendered from `/openapi.json`", HTML)},
            description="Self-contained: no script, nothing from another origin. The "
            "dashboard links to it.",
        ),
    ]


def metrics_operation(metrics: Metrics) -> Operation:
    return Operation(
        "GET",
        "/metrics",
        metrics.handle,
        "getMetrics",
        "status",
        "Prometheus metrics: the CLI, ttyd, resleeves, exits, messages, HTTP requests",
        {200: Media("Prometheus text format 0.0.4", "text/plain")},
        description="Guarded like every route but `/health`: a scrape uses the bearer token "
        "(`authorization: {credentials_file: ...}` in a Prometheus scrape config); the view "
        "token is enough.",
    )


def create_app(sup: Supervisor) -> web.Application:
    cfg = sup.config
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SUPERVISOR] = sup

    async def end_event_streams(app: web.Application) -> None:
        # Shutdown waits for every handler: an /events stream would otherwise hold it open
        # until its client goes away.
        sup.bus.close()

    app.on_shutdown.append(end_event_streams)
    operations = [
        *status_operations(sup),
        *screen_operations(sup),
        resleeve_operation(),
        events_operation(sup),
        *page_operations(),
        *message_operations(app, cfg.workspace, sup.owner),
        *terminal_operations(app, sup),
        *agent_operations(app, sup.awareness, sup.registry),
        *approval_operations(sup.awareness.approvals),
        *egress_operations(sup.egress, sup.audit),
        audit_operation(sup.audit),
        *recording_operations(sup.awareness.recorder),
        *usage_operations(sup.awareness.spending),
        *link_operations(sup.notifier),
        *notify_operations(sup.notifier),
    ]
    boxes = app[MAILBOXES]
    requests = RequestCounter()
    operations.append(metrics_operation(Metrics(sup, requests, boxes.inbox, boxes.outbox)))
    public = []  # the routes that need no API token (/health, Claude Code's hooks)
    capability = []  # and those whose URL is the credential (notification links)
    for op in operations:
        route = app.router.add_route(op.method, op.path, op.handler)
        if op.public and route.resource is not None:
            public.append(route.resource)
        if op.capability and route.resource is not None:
            capability.append(route.resource)
    guard = make_guard(
        allowed_origins=cfg.allowed_origins,
        token=cfg.token,
        view_token=cfg.view_token,
        public=public,
        capability=capability,
    )
    app.middlewares.extend([make_answers(requests), guard])
    spec = document(operations, cli_names=sup.registry, secured=bool(cfg.token or cfg.view_token))
    app[OPENAPI] = json.dumps(spec).encode()
    app[API_PAGE] = ApiPage(app[OPENAPI])
    return app
