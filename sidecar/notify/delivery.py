"""Getting a notification out: one bounded HTTP request (time, bytes, no redirect), retries with
backoff on 5xx and network errors only, and a channel's bounded queue worked by one task, so
that a slow or hostile receiver never holds up the API, the agent or another channel.

The sidecar's requests go straight out (aiohttp's `trust_env` is off): they are not the CLI's
and never pass its egress proxy, which guards the CLI's processes only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import aiohttp

from sidecar.core.contract import rfc3339
from sidecar.core.shapes import ChannelLast, ChannelName
from sidecar.core.text import one_line
from sidecar.notify.notice import Notice

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
TIMEOUT = 10.0  # seconds one attempt may take, connecting included
BACKOFF = (1.0, 3.0)  # seconds before the second and the third attempt
DETAIL_BYTES = 200  # of an error answer's body, for the status; the rest is never read
QUEUE = 32  # jobs a channel holds; past that a new one is dropped (and counted failed)


@dataclass(frozen=True)
class Result:
    ok: bool
    detail: str
    retry: bool = False  # worth another try: a 5xx, a network error, no answer in time
    status: int | None = None


def target_of(url: str) -> str:
    """What /status may show of a URL: scheme and host (its path or query may be its key)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


class Http:
    """The sidecar's own HTTP client for notifications, made on first use (a channel that never
    sends costs no session)."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT, connect=CONNECT_TIMEOUT),
                # Every request on a new connection, closed after the status line: a receiver
                # cannot keep one busy, and nothing of a large answer is read.
                connector=aiohttp.TCPConnector(force_close=True, limit=8),
                auto_decompress=False,
                trust_env=False,
            )
        return self._session

    async def send(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Result:
        """One attempt: the answer's status, never following a redirect, reading at most
        DETAIL_BYTES of an error's body (and none of a success's)."""
        try:
            async with self.session().request(
                method, url, data=body, headers=dict(headers), allow_redirects=False
            ) as resp:
                status = resp.status
                if 200 <= status < 300:
                    resp.close()
                    return Result(True, f"answered {status}", status=status)
                head = b""
                if not 300 <= status < 400:
                    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                        head = await resp.content.read(DETAIL_BYTES)
                resp.close()
        except TimeoutError:
            return Result(False, f"no answer within {TIMEOUT:g} s", retry=True)
        except (aiohttp.ClientError, OSError) as exc:
            why = f"cannot reach {target_of(url)}: {one_line(str(exc), 160)}"
            return Result(False, why, retry=True)
        text = one_line(head.decode(errors="replace"), 120)
        if 300 <= status < 400:
            return Result(False, f"answered {status}: redirects are not followed", status=status)
        detail = f"answered {status}" + (f": {text}" if text else "")
        return Result(False, detail, retry=status >= 500, status=status)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
            # A closed connection's socket goes on the loop's next turn (aiohttp's advice).
            await asyncio.sleep(0)


async def with_retries(
    attempt: Callable[[], Awaitable[Result]], wanted: Callable[[], bool]
) -> Result | None:
    """`attempt` until it succeeds or fails for good, waiting BACKOFF between tries; None when
    the notification stopped being wanted (withdrawn) before it went out."""
    result: Result | None = None
    for delay in (0.0, *BACKOFF):
        if delay:
            await asyncio.sleep(delay)  # sleep-ok: the backoff between two deliveries
        if not wanted():
            return result
        result = await attempt()
        if result.ok or not result.retry:
            return result
        log.info("delivery failed (%s); trying again", result.detail)
    return result


Job = tuple[Literal["send", "withdraw"], Notice]


@dataclass
class Stats:
    sent: int = 0
    failed: int = 0
    suppressed: int = 0
    last: ChannelLast | None = None

    def record(self, result: Result) -> None:
        if result.ok:
            self.sent += 1
        else:
            self.failed += 1
        self.last = ChannelLast(time=rfc3339(), ok=result.ok, detail=result.detail)


class Channel:
    """A place notifications go. Subclasses say how one is delivered and withdrawn; the queue
    and its one worker are here."""

    name: ChannelName

    def __init__(self, target: str, http: Http) -> None:
        self.target = target
        self.http = http
        self.stats = Stats()
        self.on_failed: Callable[[ChannelName, Result], None] = lambda channel, result: None
        self._queue: asyncio.Queue[Job] = asyncio.Queue(QUEUE)

    async def attempt(self, notice: Notice) -> Result:
        """One try at sending `notice`."""
        raise NotImplementedError

    async def deliver(self, notice: Notice) -> Result | None:
        """Send `notice`, trying again where that makes sense; what came of it, or None when
        it was withdrawn before it went out."""
        return await with_retries(lambda: self.attempt(notice), lambda: not notice.withdrawn)

    async def withdraw(self, notice: Notice) -> None:
        """Take a delivered notice back where the channel can (nothing by default)."""

    def offer(self, kind: Literal["send", "withdraw"], notice: Notice) -> None:
        try:
            self._queue.put_nowait((kind, notice))
        except asyncio.QueueFull:
            if kind == "send":
                self.stats.record(Result(False, f"dropped: {QUEUE} notifications were queued"))

    async def run(self) -> None:
        """The channel's worker: one job at a time, in order (a withdrawal after its send)."""
        while True:
            kind, notice = await self._queue.get()
            try:
                await self._do(kind, notice)
            except Exception:  # a bug in one delivery must not end the channel's worker
                log.exception("notification %s to %s failed", notice.id, self.name)

    async def _do(self, kind: Literal["send", "withdraw"], notice: Notice) -> None:
        if kind == "withdraw":
            if self.name in notice.delivered:
                await self.withdraw(notice)
            return
        result = await self.deliver(notice)
        if result is None:
            return  # withdrawn before it went out
        self.stats.record(result)
        if result.ok:
            notice.delivered.add(self.name)
        else:
            log.warning("notification %s to %s failed: %s", notice.id, self.name, result.detail)
            self.on_failed(self.name, result)
