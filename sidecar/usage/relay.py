"""The user's own OTLP destination kept working: each logs request the sidecar accepted is sent
on, as it came, to where the user's environment had the CLI send its logs. In the background, one
request at a time, each bounded in time; a destination that cannot keep up loses requests (one
warning), never the CLI's or the sidecar's time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from sidecar.usage.telemetry import Destination

log = logging.getLogger(__name__)

QUEUE = 64  # requests waiting to be sent on
TIMEOUT = 10.0  # seconds per request


class Relay:
    def __init__(self) -> None:
        self._queue: asyncio.Queue[tuple[Destination, bytes, str]] = asyncio.Queue(QUEUE)
        self._task: asyncio.Task[None] | None = None
        self._warned = False
        self.sent = 0
        self.failed = 0

    def send(self, to: Destination, body: bytes, content_type: str) -> None:
        try:
            self._queue.put_nowait((to, body, content_type))
        except asyncio.QueueFull:
            self.failed += 1
            self._warn(f"{to.url} is not keeping up; a logs request was dropped")
            return
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="telemetry-relay")

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                to, body, content_type = await self._queue.get()
                headers = {**to.headers, "Content-Type": content_type}
                try:
                    async with session.post(to.url, data=body, headers=headers) as answer:
                        if answer.status >= 400:
                            raise aiohttp.ClientResponseError(
                                answer.request_info, (), status=answer.status
                            )
                    self.sent += 1
                    self._warned = False
                except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                    self.failed += 1
                    self._warn(f"{to.url}: {exc!r}")

    def _warn(self, what: str) -> None:
        if not self._warned:  # once per run of failures
            self._warned = True
            log.warning("telemetry relay to the CLI's own OTLP destination: %s", what)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
