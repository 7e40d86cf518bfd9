"""`GET /events`: the event bus as an NDJSON stream that stays open, with a heartbeat line when
nothing happens. A client that stops reading is dropped instead of holding memory or a shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from aiohttp import ClientConnectionResetError, web

from sidecar.api import view
from sidecar.api.openapi import NDJSON, Media, Operation
from sidecar.core.event_shapes import Heartbeat, SidecarRestart
from sidecar.core.events import encode_line
from sidecar.process.supervisor import Supervisor

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 15.0  # seconds between heartbeat lines on /events
# A stream whose line cannot be handed to the kernel for this long has a client that stopped
# reading (its socket buffer is full): it is dropped rather than held open for ever.
EVENT_WRITE_TIMEOUT = 10.0
EVENT_SNDBUF = 64 * 1024


async def stream(request: web.Request, sup: Supervisor) -> web.StreamResponse:
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
        # A first line at once: the client knows the stream is live and subscribed. From a
        # supervisor started again after a crash, that line says so (streams of the dead one
        # were cut: what happened in between is not replayed).
        first: Heartbeat | SidecarRestart = Heartbeat()
        v = view.of(sup)
        if v.restarted_at is not None:
            first = SidecarRestart(time=v.restarted_at, restarts=v.restarts)
        line: bytes | None = encode_line(first)
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


def events_operation(sup: Supervisor) -> Operation:
    async def events(request: web.Request) -> web.StreamResponse:
        return await stream(request, sup)

    return Operation(
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
    )
