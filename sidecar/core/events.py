"""In-process event bus behind `GET /events`: every subscriber gets every event, in order, each
event encoded once when published. Queues are bounded: a subscriber that stops reading is
dropped (its stream ends) instead of growing memory without limit. Listeners inside the sidecar
(the notifier) are called with the event itself, at once, and are not /events clients.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import msgspec

from sidecar.core.event_shapes import Event
from sidecar.core.masks import scrub

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode


def encode_line(event: Event) -> bytes:
    """An event as one NDJSON line."""
    return scrub(_encode(event)) + b"\n"


class Subscription:
    def __init__(self, maxsize: int) -> None:
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize)
        self.dropped = False

    async def get(self) -> bytes | None:
        """The next event's line, or None once this subscriber has been dropped."""
        if self.dropped:
            return None
        return await self.queue.get()


class EventBus:
    def __init__(self, maxsize: int = 256) -> None:
        self._maxsize = maxsize
        self._subs: set[Subscription] = set()
        self._listeners: list[Callable[[Event], None]] = []
        self._closed = False

    def subscribe(self) -> Subscription:
        sub = Subscription(self._maxsize)
        if self._closed:
            sub.dropped = True  # shutting down: the stream ends at once
        else:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    def listen(self, listener: Callable[[Event], None]) -> None:
        """Call `listener` with every event published from now on, once the streams have it.
        It must be quick and must not raise (a listener that does is logged and kept)."""
        self._listeners.append(listener)

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    def publish(self, event: Event) -> Event:
        if self._subs:
            line = encode_line(event)
            for sub in list(self._subs):
                try:
                    sub.queue.put_nowait(line)
                except asyncio.QueueFull:
                    # A reader this far behind is not reading: drop it and wake its handler.
                    log.warning("dropping an /events subscriber that stopped reading")
                    self._end(sub)
        # After the streams: what a listener publishes in turn comes after this event.
        for listener in self._listeners:
            try:
                listener(event)
            except Exception:  # a listener's bug must not cost the event its other readers
                log.exception("event listener failed on %s", type(event).__name__)
        return event

    def close(self) -> None:
        """End every stream (shutdown): each subscriber's next `get()` returns None."""
        self._closed = True
        for sub in list(self._subs):
            self._end(sub)

    def _end(self, sub: Subscription) -> None:
        self._subs.discard(sub)
        sub.dropped = True
        while not sub.queue.empty():
            sub.queue.get_nowait()
        sub.queue.put_nowait(None)
