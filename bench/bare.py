"""The baseline HTTP server: a bare aiohttp hello world, set up the way the sidecar sets up its
own (AppRunner + TCPSite, no access log), so a ratio against it measures the sidecar's handlers.

Run: python -m bench.bare PORT
"""

from __future__ import annotations

import asyncio
import signal
import sys

from aiohttp import web


async def hello(request: web.Request) -> web.Response:
    return web.Response(text="Hello, world")


async def serve(port: int) -> None:
    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1])))
