"""`/terminal`: ttyd proxied through the sidecar's own port, so ttyd is never exposed and a view
token can watch the CLI but never type: the page is fetched from ttyd, the WebSocket (subprotocol
`tty`) relayed frame for frame, a viewer's input and resize frames dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from sidecar.api import httpio, view
from sidecar.api.guard import ROLE, set_token_cookie
from sidecar.api.openapi import HTML, Media, Operation
from sidecar.core.shapes import TerminalToken
from sidecar.notify.service import Presence
from sidecar.process.supervisor import Supervisor
from sidecar.process.ttyd import BASE_PATH, VIEWER_FLAGS, WRITER_FLAGS, Upstream

log = logging.getLogger(__name__)

# ttyd listens on a unix socket only the sidecar reaches (aiohttp's UnixConnector), or, with
# TTYD_PORT, on loopback with a random credential (see `sidecar.process.ttyd.Credential`) that never
# leaves this process: the proxy adds it to every request to ttyd and puts it into the
# WebSocket's init message, and answers the page's `/terminal/token` itself with an empty token
# (ttyd's own answer is the credential). Only ttyd's page is proxied: ttyd 1.7.7 serves nothing
# else (its page is self-contained), and it normalises paths (`%74oken`, `x/../token`, `token;x`
# all reach its `/token`), so forwarding any other path could hand out the credential.
# The upstream URL is the proxy's own, never the client's: it carries the tmux attach flags as
# ttyd's URL argument, read-only for a viewer (a second guard behind the frame filter).
SESSION = web.AppKey("terminal_session", aiohttp.ClientSession)
UNIX_SESSION = web.AppKey("terminal_unix_session", aiohttp.ClientSession)
CLIENTS = web.AppKey("terminal_clients", weakref.WeakSet[web.WebSocketResponse])
# ttyd's protocol: the first client message is a JSON object ({"AuthToken", "columns",
# "rows"}); after it every frame starts with one command byte.
INPUT, RESIZE = ord("0"), ord("1")
# A viewer may pause / resume output (flow control) and size its own view: its tmux client is
# attached with ignore-size, so its size never reshapes the window, but without it tmux draws
# the viewer the size it attached with and the dashboard cannot fit the whole screen.
VIEWER_ALLOWED = frozenset({RESIZE, ord("2"), ord("3")})
TYPED = (bytes((INPUT,)), chr(INPUT))  # an input frame's first byte, as bytes or text
INIT_TIMEOUT = 10.0  # a client that never sends the init message is closed after this
OUTPUT = ord("0")  # ttyd -> client: terminal output
# After the init message a client's frames wait (unread) until ttyd's first output frame, or
# this long: see `_relay_to_ttyd`.
FIRST_OUTPUT_TIMEOUT = 5.0
CLOSE_TIMEOUT = 1.0  # how long a closing WebSocket waits for the browser's close reply
MAX_FRAME = 1 << 20
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "content-length"}
)


def _unavailable(sup: Supervisor) -> web.Response:
    status = view.of(sup).ttyd
    reason = status.reason or f"ttyd is {status.state.value}"
    return httpio.error(503, f"terminal unavailable: {reason}", **{"Retry-After": "1"})


def allowed_from_viewer(data: bytes | str) -> bool:
    """Whether a frame (after the init message) from a view-only client may pass on to ttyd."""
    raw = data.encode() if isinstance(data, str) else data
    return bool(raw) and raw[0] in VIEWER_ALLOWED


def authenticated_init(data: bytes | str, auth_token: str) -> str | None:
    """The client's init message with ttyd's credential as its AuthToken; None when it is not
    a JSON object (such a message must never reach ttyd). The size passes as sent: tmux
    ignores it (ignore-size)."""
    try:
        init = json.loads(data)
    except (ValueError, RecursionError):  # also UnicodeDecodeError; deep nesting
        return None
    if not isinstance(init, dict):
        return None
    init["AuthToken"] = auth_token
    return json.dumps(init)


async def _relay_to_ttyd(
    client: web.WebSocketResponse,
    upstream: aiohttp.ClientWebSocketResponse,
    viewer: bool,
    auth_token: str,
    first_output: asyncio.Event,
    *,
    presence: Presence,
) -> None:
    try:
        msg = await client.receive(timeout=INIT_TIMEOUT)
    except TimeoutError:
        log.info("terminal client sent no init message in %ss; closing", INIT_TIMEOUT)
        return
    if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
        return  # close, error
    init = authenticated_init(msg.data, auth_token)
    if init is None:
        log.info("terminal client's first message is not ttyd's JSON init; closing")
        await client.close(code=WSCloseCode.POLICY_VIOLATION, message=b"expected the init message")
        return
    # ttyd's page sends it as a binary frame, other clients as text: kept as it came.
    if msg.type is WSMsgType.TEXT:
        await upstream.send_str(init)
    else:
        await upstream.send_bytes(init.encode())
    # ttyd starts `tmux attach` on the init message, on a pty in canonical mode (ICANON, ECHO,
    # ISIG, ICRNL) until the tmux server takes the tty over and makes it raw. Input that ttyd
    # writes before then is the kernel's line discipline's, not tmux's: echoed back, \r turned
    # into \n, a line longer than 4095 bytes cut short, ^U/^W/DEL edited away, ^C/^Z/^\ sent
    # as signals. tmux writes its first output only after the switch, so the client's frames
    # stay unread (in aiohttp's buffer; the client's TCP window is the backpressure) until
    # ttyd's first output frame, or FIRST_OUTPUT_TIMEOUT (then they go as they would have).
    try:
        await asyncio.wait_for(first_output.wait(), FIRST_OUTPUT_TIMEOUT)
    except TimeoutError:
        log.info(
            "terminal: no output from ttyd in %ss; relaying input anyway", FIRST_OUTPUT_TIMEOUT
        )
    while True:
        msg = await client.receive()
        if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return  # close, error
        if viewer and not allowed_from_viewer(msg.data):
            continue
        if not viewer and msg.data[:1] in TYPED:
            presence.typed()  # a person types here: notifications but approvals wait
        # Awaiting the send is the backpressure: we read no faster than ttyd accepts.
        if msg.type is WSMsgType.TEXT:
            await upstream.send_str(msg.data)
        else:
            await upstream.send_bytes(msg.data)


async def _relay_to_client(
    upstream: aiohttp.ClientWebSocketResponse,
    client: web.WebSocketResponse,
    first_output: asyncio.Event,
) -> None:
    async for msg in upstream:
        if msg.type is WSMsgType.BINARY:
            if msg.data[:1] == bytes((OUTPUT,)):
                first_output.set()
            await client.send_bytes(msg.data)
        elif msg.type is WSMsgType.TEXT:
            await client.send_str(msg.data)
        else:
            return


async def websocket(request: web.Request, sup: Supervisor) -> web.StreamResponse:
    # While ttyd is starting (the sidecar itself has just started), wait for it a moment.
    target = await sup.ttyd.usable()
    if target is None:
        return _unavailable(sup)
    session = _session_for(request.app, target)
    viewer = request.get(ROLE) == "viewer"
    try:
        upstream = await session.ws_connect(
            f"{target.base_url}{BASE_PATH}/ws",
            params={"arg": VIEWER_FLAGS if viewer else WRITER_FLAGS},
            protocols=("tty",),
            max_msg_size=MAX_FRAME,
            autoping=True,
            headers=target.headers,
        )
    except (aiohttp.ClientError, OSError) as exc:
        log.warning("terminal: cannot reach ttyd: %s", exc)
        return _unavailable(sup)
    client = web.WebSocketResponse(
        protocols=("tty",), heartbeat=20.0, max_msg_size=MAX_FRAME, timeout=CLOSE_TIMEOUT
    )
    presence = sup.notifier.presence
    async with upstream:
        await client.prepare(request)
        request.app[CLIENTS].add(client)
        log.info("terminal client connected (%s)", "view-only" if viewer else "read-write")
        first_output = asyncio.Event()
        tasks = [
            asyncio.create_task(
                _relay_to_ttyd(
                    client, upstream, viewer, target.auth_token, first_output, presence=presence
                )
            ),
            asyncio.create_task(_relay_to_client(upstream, client, first_output)),
        ]
        if not viewer:
            presence.attached()
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not viewer:
                presence.detached()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    # ttyd gone (or the client, whose close is answered as it came): not a normal end of the
    # session, which would leave ttyd's page waiting for a key. 1001: its page reconnects.
    await client.close(code=WSCloseCode.GOING_AWAY, message=b"the terminal went away")
    log.info("terminal client disconnected")
    return client


async def page(request: web.Request, sup: Supervisor) -> web.StreamResponse:
    """ttyd's page (GET only), streamed back."""
    target = await sup.ttyd.usable()
    if target is None:
        return _unavailable(sup)
    headers = {
        k: v for k, v in request.headers.items() if k.lower() in ("accept", "accept-encoding")
    }
    headers.update(target.headers)
    try:
        async with _session_for(request.app, target).get(
            f"{target.base_url}{BASE_PATH}/", headers=headers, allow_redirects=False
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_HEADERS:
                    response.headers[key] = value
            set_token_cookie(request, response)  # a browser may land here with ?token=
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 16):
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, OSError) as exc:
        log.warning("terminal: cannot reach ttyd: %s", exc)
        return _unavailable(sup)


def _session_for(app: web.Application, target: Upstream) -> aiohttp.ClientSession:
    """The client session for ttyd: over its unix socket, or TCP to its loopback port."""
    return app[UNIX_SESSION] if target.socket_path is not None else app[SESSION]


def _new_session(connector: aiohttp.BaseConnector | None = None) -> aiohttp.ClientSession:
    # auto_decompress off: ttyd's gzipped page is passed through as it is.
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None, connect=5),
    )


def _client_sessions(sup: Supervisor) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        app[SESSION] = _new_session()
        # The socket path is fixed for the sidecar's life; ttyd makes the file again on start.
        app[UNIX_SESSION] = _new_session(
            aiohttp.UnixConnector(path=str(sup.config.paths.ttyd_socket))
        )
        yield
        for session in (app[SESSION], app[UNIX_SESSION]):
            with contextlib.suppress(Exception):  # closing at shutdown; nothing to do on error
                await session.close()

    return ctx


TERMINAL_TEXT = (
    "ttyd's web terminal, proxied (ttyd itself is reachable by the sidecar only). A WebSocket "
    "upgrade on `/terminal` or `/terminal/ws` with subprotocol `tty` is relayed to ttyd. A plain "
    "GET of `/terminal` redirects to `/terminal/`, whose relative URLs ttyd's page needs; "
    '`/terminal/token` answers `{"token": ""}` (the proxy authenticates to ttyd itself) and '
    "other paths below `/terminal/` are 404. While ttyd is starting, a request waits for it "
    "(up to 5 s); while it is down, 503 with the reason."
)
UPGRADE = Media(
    "WebSocket upgrade (`Upgrade: websocket`, subprotocol `tty`), relayed frame for frame to "
    "ttyd; with the view token input and resize frames are dropped, and the tmux client behind "
    "it is attached read-only"
)
PAGE = Media("ttyd's page", HTML)


def _upgrading(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def terminal_operations(app: web.Application, sup: Supervisor) -> list[Operation]:
    async def terminal(request: web.Request) -> web.StreamResponse:
        if _upgrading(request):
            return await websocket(request, sup)
        # ttyd's page loads its token and WebSocket relative to /terminal/.
        query = f"?{request.query_string}" if request.query_string else ""
        return web.Response(status=302, headers={"Location": f"{BASE_PATH}/{query}"})

    async def terminal_page(request: web.Request) -> web.StreamResponse:
        if _upgrading(request):
            return await websocket(request, sup)
        return await page(request, sup)

    async def terminal_ws(request: web.Request) -> web.StreamResponse:
        if _upgrading(request):
            return await websocket(request, sup)
        return httpio.error(400, "WebSocket upgrade required")

    async def terminal_token(request: web.Request) -> web.Response:
        # The page asks for a token to put into its init message; ttyd's answer would be its
        # credential. The proxy puts that in on the way instead.
        return httpio.answer(TerminalToken(token=""), headers={"Cache-Control": "no-store"})

    async def close_clients(app: web.Application) -> None:
        # Shutdown waits for every handler; an open terminal would hold it until its browser
        # tab closes. 1001: going away.
        open_now = app[CLIENTS]  # (two steps: mypy infers list()'s argument type otherwise)
        clients = list(open_now)
        await asyncio.gather(
            *(
                c.close(code=WSCloseCode.GOING_AWAY, message=b"sidecar shutting down")
                for c in clients
            )
        )

    app[CLIENTS] = weakref.WeakSet()
    app.on_shutdown.append(close_clients)
    app.cleanup_ctx.append(_client_sessions(sup))
    return [
        Operation(
            "GET",
            BASE_PATH,
            terminal,
            "getTerminal",
            "terminal",
            "Web terminal (ttyd) or its WebSocket",
            {101: UPGRADE, 302: Media("to `/terminal/`")},
            description=TERMINAL_TEXT,
            errors=(503,),
        ),
        Operation(
            "GET",
            f"{BASE_PATH}/",
            terminal_page,
            "getTerminalPage",
            "terminal",
            "ttyd's page",
            {101: UPGRADE, 200: PAGE},
            description=TERMINAL_TEXT,
            errors=(503,),
        ),
        Operation(
            "GET",
            f"{BASE_PATH}/token",
            terminal_token,
            "getTerminalToken",
            "terminal",
            "The token ttyd's page puts into its init message (always empty here)",
            {200: TerminalToken},
        ),
        Operation(
            "GET",
            f"{BASE_PATH}/ws",
            terminal_ws,
            "getTerminalSocket",
            "terminal",
            "The terminal WebSocket (subprotocol `tty`)",
            {101: UPGRADE},
            description="400 without `Upgrade: websocket`.",
            errors=(400, 503),
        ),
    ]
