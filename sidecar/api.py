"""The HTTP API: `create_app()` wires the route table, auth and JSON errors around a running
Supervisor, and builds the OpenAPI document from the same table.

This is the one place where errors become HTTP statuses (`json_errors`). Request paths never
fork a process: /status reads the supervisor's in-memory state plus two `stat` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from http.cookies import SimpleCookie
from importlib import resources
from typing import Literal
from urllib.parse import urlsplit

from aiohttp import ClientConnectionResetError, web
from msgspec import UnsetType

from sidecar import httpio, mailbox
from sidecar.agent_api import HookRefused, agent_operations
from sidecar.api_messages import message_operations
from sidecar.awareness import NotRunning, StateMismatch
from sidecar.contract import MAX_BODY_BYTES
from sidecar.events import encode_line
from sidecar.httpio import BadRequest, error
from sidecar.openapi import HTML, NDJSON, Media, Operation, document
from sidecar.pane_input import DeliveryError, InputError
from sidecar.shapes import (
    AgentInfo,
    HealthAnswer,
    Heartbeat,
    Progress,
    ResleeveAccepted,
    ResleeveRequest,
    StatusAnswer,
)
from sidecar.states import ProcState
from sidecar.supervisor import ResleeveBusy, Supervisor, UnknownCLI
from sidecar.terminal import terminal_operations

log = logging.getLogger(__name__)

SUPERVISOR = web.AppKey("supervisor", Supervisor)
OPENAPI = web.AppKey("openapi", bytes)  # the document, encoded once
HEARTBEAT_EVERY = 15.0  # seconds between heartbeat lines on /events
# A stream whose line cannot be handed to the kernel for this long has a client that stopped
# reading (its socket buffer is full): it is dropped rather than held open for ever.
EVENT_WRITE_TIMEOUT = 10.0
EVENT_SNDBUF = 64 * 1024
COOKIE = "sidecar_token"
NEW_COOKIE = "sidecar_new_cookie"  # request key: the token to set as a cookie in the answer
Role = Literal["admin", "viewer"]
PUBLIC = frozenset({"/health"})
# Claude Code's hooks: no API token (the CLI never has it), their own secret (sidecar.agent_api).
PUBLIC_PREFIXES = ("/hooks/",)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# ---- middlewares ---------------------------------------------------------------------------


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Errors become statuses here, and only here; every one answers `{"error": ...}`: what the
    framework raises (404, 405, 413, ...) and what the handlers and the layers below raise."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        message = (
            exc.reason if exc.text is None or exc.text.startswith(f"{exc.status}:") else exc.text
        )
        if exc.status == 413:
            message = f"request body too large (limit {MAX_BODY_BYTES} bytes)"
        return error(exc.status, message, **headers)
    except (BadRequest, UnknownCLI, InputError) as exc:
        return error(400, str(exc))
    except HookRefused as exc:
        return error(403, str(exc))
    except (ResleeveBusy, NotRunning, StateMismatch, DeliveryError) as exc:
        return error(409, str(exc))
    except mailbox.UnsafePathError as exc:
        # The workspace is set up so that writing would leave it: a state problem, not the
        # client's fault and not transient either.
        return error(409, str(exc))
    except mailbox.MailboxFullError as exc:
        return error(507, f"{exc}; ack messages to make room")
    except (asyncio.CancelledError, ConnectionError, ClientConnectionResetError):
        raise  # the client went away: nobody to answer
    except OSError as exc:  # a file the route needs (a message file): the disk, permissions
        log.warning("%s %s: file I/O failed: %s", request.method, request.path, exc)
        status = 507 if exc.errno == errno.ENOSPC else 500
        return error(status, f"file I/O failed: {exc.strerror}")
    except Exception:  # a bug: logged with its traceback, answered as JSON like every error
        log.exception("%s %s failed", request.method, request.path)
        return error(500, "internal error (the sidecar's log has the details)")


def _is_local_host(host: str) -> bool:
    """An IP literal or localhost: a name no DNS answer can point elsewhere."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
        if name == "localhost" or name.endswith(".localhost"):
            return True
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def make_origin_guard(
    allowed: frozenset[str], have_token: bool
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Refuse what a web page elsewhere makes a browser send here (CSRF, WebSocket hijacking).

    A browser names the page's origin on every WebSocket handshake and cross-origin-capable
    request, and says it is a browser with Sec-Fetch-Site. Such a request passes when its origin
    is this server's own (the Host it asked for) or listed in SIDECAR_ALLOWED_ORIGINS. With no
    token set, a browser must also have asked for an IP address or localhost: a DNS name could
    be rebound to this machine by the page that made the request. Clients that are not browsers
    (the envoy, curl) send neither header and are not affected.
    """

    @web.middleware
    async def origin_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        browser = origin is not None or "Sec-Fetch-Site" in request.headers
        if not browser or "*" in allowed:
            return await handler(request)
        listed = origin is not None and origin.rstrip("/").lower() in allowed
        if origin is not None and not listed:
            own = urlsplit(origin).netloc.lower() == request.host.lower()
            if origin == "null" or not own:
                return error(403, f"cross-origin request from {origin} refused")
        if not have_token and not listed and not _is_local_host(request.host):
            return error(
                403,
                f"a browser asked for {request.host}, which is not an IP address or localhost; "
                "set SIDECAR_TOKEN to serve browsers by name",
            )
        return await handler(request)

    return origin_guard


def _token_role(request: web.Request, tokens: dict[str, Role]) -> tuple[Role | None, str | None]:
    """Which role the request's token grants, and the token itself (None: no valid token)."""
    candidates: list[str] = []
    auth = request.headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            candidates.append(value.strip())
    if "token" in request.query:
        candidates.append(request.query["token"])
    if COOKIE in request.cookies:
        candidates.append(request.cookies[COOKIE])
    for candidate in candidates:
        given = candidate.encode("utf-8", "surrogateescape")
        # Compare against every configured token, in constant time, whatever matches.
        matched: Role | None = None
        for token, role in tokens.items():
            if hmac.compare_digest(given, token.encode("utf-8")) and matched is None:
                matched = role
        if matched is not None:
            return matched, candidate
    return None, None


def make_auth(
    token: str | None, view_token: str | None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    tokens: dict[str, Role] = {}
    if token:
        tokens[token] = "admin"
    if view_token:
        tokens[view_token] = "viewer"

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not tokens or request.path in PUBLIC or request.path.startswith(PUBLIC_PREFIXES):
            request["role"] = "admin" if not tokens else "public"
            return await handler(request)
        role, used = _token_role(request, tokens)
        if role is None:
            given = (
                "Authorization" in request.headers
                or "token" in request.query
                or COOKIE in request.cookies
            )
            message = (
                "invalid token"
                if given
                else "authentication required: Authorization: Bearer <token>"
            )
            return error(401, message, **{"WWW-Authenticate": 'Bearer realm="sidecar"'})
        if role == "viewer" and request.method not in ("GET", "HEAD"):
            return error(403, "the view token is read-only")
        request["role"] = role
        if "token" in request.query and used is not None:
            # A browser passes ?token= once; the cookie carries it from then on. Set when the
            # answer's headers go out (`_set_token_cookie`), streamed answers included.
            request[NEW_COOKIE] = used
        return await handler(request)

    return auth


async def _set_token_cookie(request: web.Request, response: web.StreamResponse) -> None:
    token = request.get(NEW_COOKIE)
    if token is not None:
        # This hook runs after aiohttp rendered the response's cookies: add the header itself.
        cookie: SimpleCookie = SimpleCookie()
        cookie[COOKIE] = token
        morsel = cookie[COOKIE]
        morsel["httponly"] = True
        morsel["samesite"] = "Strict"
        morsel["path"] = "/"
        response.headers.add("Set-Cookie", morsel.OutputString())


# ---- routes ----------------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    sup = request.app[SUPERVISOR]
    uptime = int(time.monotonic() - sup.started)
    return httpio.answer(
        HealthAnswer(
            status="healthy" if sup.healthy else "degraded",
            uptime=uptime,
            agent=sup.awareness.machine.state.value,
        )
    )


def _last_activity(sup: Supervisor) -> float | None:
    times = [sup.current.mtime]
    if sup.pane is not None:
        # The kernel stamps a tty's mtime when it is written (to within 8 s): the CLI's
        # last output, without asking tmux.
        with contextlib.suppress(OSError):
            times.append(os.stat(sup.pane.tty).st_mtime)
    known = [t for t in times if t is not None]
    return max(known) if known else None


def agent_info(sup: Supervisor) -> AgentInfo:
    agent = sup.awareness.machine.status()
    return AgentInfo(
        state=agent.state.value,
        since=_iso_ms(agent.since),
        reason=agent.reason,
        source=agent.source,  # type: ignore[arg-type]  # hooks, activity or none
        session_id=agent.session_id,
    )


def _iso_ms(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def status_body(sup: Supervisor) -> StatusAnswer:
    state = sup.current.get()
    running = sup.cli.state is ProcState.RUNNING
    ttyd = sup.ttyd.status
    warnings = [*sup.warnings, *state.warnings]
    for name, proc in (("CLI", sup.cli), ("ttyd", ttyd)):
        if proc.state in (ProcState.FATAL, ProcState.BACKOFF) and proc.reason:
            warnings.append(f"{name}: {proc.reason}")
    return StatusAnswer(
        sleeve_id=sup.config.sleeve_name,
        status=state.status,
        current_task=state.task,
        progress=Progress(total=state.progress_total, completed=state.progress_completed),
        blockers=list(state.blockers),
        next_steps=list(state.next_steps),
        cli=sup.cli_name,
        cli_pid=sup.cli.pid if running else None,
        cli_running=running,
        cli_state=sup.cli.state,
        cli_exit_code=sup.cli.exit_code,
        resleeving=sup.resleeving,
        ttyd_state=ttyd.state,
        last_activity=_iso(_last_activity(sup)),
        health="healthy" if sup.healthy else "degraded",
        repo=sup.config.repo,
        warnings=warnings,
        agent=agent_info(sup),
    )


async def status(request: web.Request) -> web.Response:
    return httpio.answer(status_body(request.app[SUPERVISOR]))


async def resleeve(request: web.Request) -> web.Response:
    body = await httpio.read_optional_body(request, ResleeveRequest)
    name = None if body is None or isinstance(body.cli, UnsetType) else body.cli
    chosen, _ = request.app[SUPERVISOR].begin_resleeve(name)
    return httpio.answer(ResleeveAccepted(status="resleeving", cli=chosen), status=202)


async def events(request: web.Request) -> web.StreamResponse:
    sup = request.app[SUPERVISOR]
    sub = sup.bus.subscribe()
    response = web.StreamResponse(headers={"Content-Type": NDJSON, "Cache-Control": "no-store"})
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None:
        # A small kernel buffer per stream: a client that stops reading is noticed (and
        # dropped) after ~EVENT_SNDBUF bytes, not after megabytes of autotuned buffer.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, EVENT_SNDBUF)
    response.force_close()  # a stream is the last answer on its connection
    try:
        await response.prepare(request)
        # A first line at once: the client knows the stream is live and subscribed.
        line: bytes | None = encode_line(Heartbeat())
        while line is not None:  # None: dropped for not reading, or shutting down
            await asyncio.wait_for(response.write(line), EVENT_WRITE_TIMEOUT)
            try:
                line = await asyncio.wait_for(sub.get(), HEARTBEAT_EVERY)
            except TimeoutError:
                line = encode_line(Heartbeat())
    except (ConnectionError, ClientConnectionResetError):
        log.debug("an /events client went away")  # browsers close streams all the time
    except TimeoutError:
        log.warning("dropping an /events client that stopped reading")
        if request.transport is not None:
            request.transport.abort()  # what it did not read is of no use to it
    finally:
        sup.bus.unsubscribe(sub)
    return response


async def openapi(request: web.Request) -> web.Response:
    return httpio.raw_answer(request.app[OPENAPI])


async def dashboard(request: web.Request) -> web.Response:
    page = resources.files("sidecar").joinpath("static/dashboard.html").read_bytes()
    return web.Response(
        body=page, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-store"}
    )


def core_operations() -> list[Operation]:
    return [
        Operation(
            "GET",
            "/health",
            health,
            "getHealth",
            "status",
            "Liveness: 200 whenever the sidecar runs",
            {200: HealthAnswer},
            description="Never needs a token; `degraded` means the CLI is not running.",
            public=True,
        ),
        Operation(
            "GET",
            "/status",
            status,
            "getStatus",
            "status",
            "The sleeve's state: CURRENT.md, the CLI process and health",
            {200: StatusAnswer},
        ),
        Operation(
            "POST",
            "/resleeve",
            resleeve,
            "resleeve",
            "control",
            "Restart the CLI, optionally as another CLI",
            {202: ResleeveAccepted},
            description="The body is optional; without `cli` the current CLI is stopped and "
            "started again (with its resume command, if it has one). 400: an unknown CLI (the "
            "message lists the known ones); 409: a resleeve is already in progress or the "
            "sidecar is shutting down. Progress is reported on `/events` (`resleeve`).",
            body=ResleeveRequest,
            body_required=False,
            errors=(400, 409),
        ),
        Operation(
            "GET",
            "/events",
            events,
            "getEvents",
            "status",
            "Event stream: one JSON object per line",
            {
                200: Media(
                    "NDJSON stream that stays open; each line is an `Event`",
                    NDJSON,
                    {"$ref": "#/components/schemas/Event"},
                )
            },
        ),
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
    ]


def create_app(sup: Supervisor) -> web.Application:
    cfg = sup.config
    app = web.Application(
        client_max_size=MAX_BODY_BYTES,
        middlewares=[
            json_errors,
            make_origin_guard(cfg.allowed_origins, have_token=bool(cfg.token)),
            make_auth(cfg.token, cfg.view_token),
        ],
    )
    app[SUPERVISOR] = sup
    app.on_response_prepare.append(_set_token_cookie)

    async def end_event_streams(app: web.Application) -> None:
        # Shutdown waits for every handler: an /events stream would otherwise hold it open
        # until its client goes away.
        sup.bus.close()

    app.on_shutdown.append(end_event_streams)
    operations = [
        *core_operations(),
        *message_operations(app, cfg.workspace),
        *terminal_operations(app, sup),
        *agent_operations(app, sup.awareness),
    ]
    for op in operations:
        app.router.add_route(op.method, op.path, op.handler)
    spec = document(operations, cli_names=sup.registry, secured=bool(cfg.token or cfg.view_token))
    app[OPENAPI] = json.dumps(spec).encode()
    return app
