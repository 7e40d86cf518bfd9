"""An aiohttp application served on a free loopback port from a thread of its own (the stubs and
receivers the tests talk to), stopped with every connection's socket closed: a socket left to the
garbage collector becomes a ResourceWarning, an error under `filterwarnings = error`, in whichever
test happens to run when it is collected.
"""

from __future__ import annotations

import asyncio
import inspect
import ssl
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

CLOSE_TURNS = 100  # loop turns the aborted connections get to close their sockets
START_TURNS = 100  # loop turns the connections accepted before a stop get to be attached


class ThreadedApp:
    """`runner_args`: web.AppRunner's keyword arguments (access_log=None is the default);
    `ssl_context`: served over TLS with it."""

    def __init__(
        self, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None, **runner_args: Any
    ) -> None:
        self.host = host
        self.ssl_context = ssl_context
        self._runner_args = {"access_log": None, **runner_args}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        # Every connection a request came on: a response still being written (a stream the
        # client stopped reading) keeps its transport open through the runner's cleanup.
        self._transports: set[asyncio.Transport] = set()

    def serve(self, app: web.Application) -> str:
        """Start serving `app`; its base URL (`http://host:port`)."""

        @web.middleware
        async def track(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            if request.transport is not None:
                self._transports.add(request.transport)
            return await handler(request)

        app.middlewares.append(track)

        async def start() -> str:
            self._runner = web.AppRunner(app, **self._runner_args)
            await self._runner.setup()
            await web.TCPSite(self._runner, self.host, 0, ssl_context=self.ssl_context).start()
            scheme = "https" if self.ssl_context is not None else "http"
            return f"{scheme}://{self.host}:{self._runner.addresses[0][1]}"

        self._thread.start()
        return asyncio.run_coroutine_threadsafe(start(), self._loop).result(10)

    def stop(self) -> None:
        async def close() -> None:
            # The runner's cleanup closes the listening socket first, in this same step: no
            # connection is accepted between the two.
            await _accepts_attached()
            if self._runner is not None:
                await self._runner.cleanup()
            for transport in self._transports:
                transport.abort()  # its socket closes on a later turn of the loop
            for _ in range(CLOSE_TURNS):
                if all(_closed(t) for t in self._transports):
                    break
                await asyncio.sleep(0)  # sleep-ok: one turn of the loop, bounded by CLOSE_TURNS

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()


def _closed(transport: asyncio.Transport) -> bool:
    try:
        sock = transport.get_extra_info("socket")
    except AttributeError:  # a TLS transport, closed: it has no protocol left to ask
        return True
    return sock is None or sock.fileno() == -1


async def _accepts_attached() -> None:
    """Turns of the loop until every task on it has started, so that no connection is still
    being accepted when the listening socket closes. asyncio accepts a connection in one turn
    and attaches it to its server in the next, in a task (CPython gh-109564, open): a server
    closed in between fails that task before its transport is whole, nothing closes its socket,
    and the garbage collector's ResourceWarning fails whichever test runs then."""
    for _ in range(START_TURNS):
        if not any(_unstarted(task) for task in asyncio.all_tasks()):
            return
        await asyncio.sleep(0)  # sleep-ok: one turn of the loop, bounded by START_TURNS


def _unstarted(task: asyncio.Task[Any]) -> bool:
    coro = task.get_coro()
    return inspect.iscoroutine(coro) and inspect.getcoroutinestate(coro) == inspect.CORO_CREATED
