"""`/terminal`: ttyd proxied through the sidecar's own port, so ttyd is never exposed.

The page and its assets are fetched from ttyd (which runs with `--base-path /terminal`); the
WebSocket (subprotocol `tty`) is relayed frame for frame. A viewer's input and resize frames
are dropped here, so a view token can watch the CLI but never type or reshape its window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from sidecar.supervisor import ProcState, Supervisor
from sidecar.ttyd import BASE_PATH

log = logging.getLogger(__name__)

SESSION = web.AppKey("terminal_session", aiohttp.ClientSession)
CLIENTS = web.AppKey("terminal_clients", weakref.WeakSet[web.WebSocketResponse])
# ttyd's protocol: the first client message is a JSON object ({"AuthToken", "columns",
# "rows"}); after it every frame starts with one command byte.
INPUT, RESIZE = ord("0"), ord("1")
VIEWER_ALLOWED = frozenset({ord("2"), ord("3")})  # pause / resume output: flow control only
INIT_TIMEOUT = 10.0  # a client that never sends the init message is closed after this
CLOSE_TIMEOUT = 1.0  # how long a closing WebSocket waits for the browser's close reply
MAX_FRAME = 1 << 20
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "content-length"}
)


def _unavailable(sup: Supervisor) -> web.Response:
    reason = sup.ttyd.reason or f"ttyd is {sup.ttyd.state.value}"
    return web.json_response(
        {"error": f"terminal unavailable: {reason}"}, status=503, headers={"Retry-After": "1"}
    )


def allowed_from_viewer(data: bytes | str, first: bool) -> bool:
    """Whether a frame from a view-only client may pass on to ttyd."""
    raw = data.encode() if isinstance(data, str) else data
    if first:
        return raw[:1] == b"{"  # the init message (size is ignored by tmux: ignore-size)
    return bool(raw) and raw[0] in VIEWER_ALLOWED


async def _relay_to_ttyd(
    client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse, viewer: bool
) -> None:
    first = True
    while True:
        try:
            msg = await client.receive(timeout=INIT_TIMEOUT if first else None)
        except TimeoutError:
            log.info("terminal client sent no init message in %ss; closing", INIT_TIMEOUT)
            return
        if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return  # close, error
        if viewer and not allowed_from_viewer(msg.data, first):
            first = False
            continue
        first = False
        # Awaiting the send is the backpressure: we read no faster than ttyd accepts.
        if msg.type is WSMsgType.TEXT:
            await upstream.send_str(msg.data)
        else:
            await upstream.send_bytes(msg.data)


async def _relay_to_client(
    upstream: aiohttp.ClientWebSocketResponse, client: web.WebSocketResponse
) -> None:
    async for msg in upstream:
        if msg.type is WSMsgType.BINARY:
            await client.send_bytes(msg.data)
        elif msg.type is WSMsgType.TEXT:
            await client.send_str(msg.data)
        else:
            return


async def websocket(request: web.Request, sup: Supervisor) -> web.StreamResponse:
    if sup.ttyd.state is not ProcState.RUNNING:
        return _unavailable(sup)
    session = request.app[SESSION]
    url = f"http://127.0.0.1:{sup.config.ttyd_port}{BASE_PATH}/ws"
    try:
        upstream = await session.ws_connect(
            url, protocols=("tty",), max_msg_size=MAX_FRAME, autoping=True
        )
    except (aiohttp.ClientError, OSError) as exc:
        log.warning("terminal: cannot reach ttyd: %s", exc)
        return _unavailable(sup)
    client = web.WebSocketResponse(
        protocols=("tty",), heartbeat=20.0, max_msg_size=MAX_FRAME, timeout=CLOSE_TIMEOUT
    )
    async with upstream:
        await client.prepare(request)
        request.app[CLIENTS].add(client)
        viewer = request.get("role") == "viewer"
        log.info("terminal client connected (%s)", "view-only" if viewer else "read-write")
        tasks = [
            asyncio.create_task(_relay_to_ttyd(client, upstream, viewer)),
            asyncio.create_task(_relay_to_client(upstream, client)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    log.info("terminal client disconnected")
    return client


async def page(request: web.Request, sup: Supervisor) -> web.StreamResponse:
    """ttyd's page and its assets (GET only), streamed back."""
    if sup.ttyd.state is not ProcState.RUNNING:
        return _unavailable(sup)
    tail = request.match_info.get("tail", "")
    url = f"http://127.0.0.1:{sup.config.ttyd_port}{BASE_PATH}/{tail}"
    headers = {
        k: v for k, v in request.headers.items() if k.lower() in ("accept", "accept-encoding")
    }
    try:
        async with request.app[SESSION].get(
            url, headers=headers, allow_redirects=False
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in HOP_HEADERS:
                    response.headers[key] = value
            await response.prepare(request)
            async for chunk in upstream.content.iter_chunked(1 << 16):
                await response.write(chunk)
            await response.write_eof()
            return response
    except (aiohttp.ClientError, OSError) as exc:
        log.warning("terminal: cannot reach ttyd: %s", exc)
        return _unavailable(sup)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    # auto_decompress off: ttyd's gzipped page is passed through as it is.
    session = aiohttp.ClientSession(
        auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, connect=5)
    )
    app[SESSION] = session
    yield
    with contextlib.suppress(Exception):  # closing at shutdown; nothing useful to do on error
        await session.close()


def add_terminal_routes(app: web.Application, sup: Supervisor) -> None:
    async def terminal(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await websocket(request, sup)
        if request.path == BASE_PATH:
            # ttyd's page loads its token and WebSocket relative to /terminal/.
            query = f"?{request.query_string}" if request.query_string else ""
            return web.Response(status=302, headers={"Location": f"{BASE_PATH}/{query}"})
        if request.match_info.get("tail") == "ws":
            return web.json_response({"error": "WebSocket upgrade required"}, status=400)
        return await page(request, sup)

    async def close_clients(app: web.Application) -> None:
        # Shutdown waits for every handler; an open terminal would hold it until its browser
        # tab closes. 1001: going away.
        open_now = app[CLIENTS]
        clients = list(open_now)
        await asyncio.gather(
            *(
                c.close(code=WSCloseCode.GOING_AWAY, message=b"sidecar shutting down")
                for c in clients
            )
        )

    app[CLIENTS] = weakref.WeakSet()
    app.on_shutdown.append(close_clients)
    app.cleanup_ctx.append(_client_session)
    app.router.add_get(BASE_PATH, terminal)
    app.router.add_get(BASE_PATH + "/{tail:.*}", terminal)
