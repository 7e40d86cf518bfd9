"""HTTP routes for needlecast messages: GET /outbox, POST /outbox/ack, GET /inbox, POST /inbox.

Request checks and error statuses live here; file work is in `sidecar.mailbox` and runs in a
worker thread (`asyncio.to_thread`), since it takes a file lock and may wait on other writers.

Errors are `{"error": ...}`: 400 bad JSON or fields, 413 body over MAX_BODY_BYTES (256 KiB),
409 `.needlecast/` or a message file is a symlink leading out of the workspace (nothing is read
or written through it), 507 the mailbox is past its 16 MiB limit or the disk is full.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import logging
import pathlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sidecar import needlecast
from sidecar.contract import MESSAGE_TYPES
from sidecar.mailbox import Mailbox, MailboxFullError, UnsafePathError
from sidecar.needlecast import Message

logger = logging.getLogger(__name__)

#: Largest request body accepted by POST /inbox and POST /outbox/ack; past it: 413.
MAX_BODY_BYTES = 256 * 1024
#: Longest `from`, `to`, `thread` value (one line of text).
MAX_NAME_CHARS = 256


@dataclasses.dataclass(frozen=True)
class Mailboxes:
    inbox: Mailbox
    outbox: Mailbox


MAILBOXES = web.AppKey("needlecast_mailboxes", Mailboxes)


def add_message_routes(app: web.Application, workspace: pathlib.Path) -> None:
    """Register the four message routes; files live in `<workspace>/.needlecast/`."""
    app[MAILBOXES] = Mailboxes(
        inbox=Mailbox(workspace, "inbox"), outbox=Mailbox(workspace, "outbox")
    )
    app.router.add_get("/outbox", _Listing(app[MAILBOXES].outbox).handle)
    app.router.add_post("/outbox/ack", _ack_outbox)
    app.router.add_get("/inbox", _Listing(app[MAILBOXES].inbox).handle)
    app.router.add_post("/inbox", _post_inbox)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def _guarded(work: Callable[[], Awaitable[web.Response]]) -> web.Response:
    """Turn the errors this module knows into JSON answers with a fitting status."""
    try:
        return await work()
    except _BadRequest as exc:
        return _error(exc.status, str(exc))
    except UnsafePathError as exc:
        # The workspace is set up so that writing would leave it: a state problem, not the
        # client's fault and not transient either.
        return _error(409, str(exc))
    except ValueError as exc:  # render_message refused a header value
        return _error(400, f"message cannot be written: {exc}")
    except MailboxFullError as exc:
        return _error(507, f"{exc}; ack messages to make room")
    except OSError as exc:
        logger.warning("message file I/O failed: %s", exc)
        return _error(
            507 if exc.errno == errno.ENOSPC else 500, f"message file I/O failed: {exc.strerror}"
        )


async def _read_json(request: web.Request) -> Any:
    """The request's JSON body, read without ever holding more than MAX_BODY_BYTES."""
    too_big = f"request body is larger than {MAX_BODY_BYTES} bytes"
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _BadRequest(413, too_big)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(64 * 1024)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _BadRequest(413, too_big)
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _BadRequest(400, f"body is not valid JSON: {exc}") from exc


class _Listing:
    """GET /inbox or /outbox: the JSON answer, encoded once per parse of the file.

    `Mailbox.read()` hands back the same ParseResult while the file is unchanged; encoding it
    anew for every GET was most of the route's cost (1,000 messages are ~300 KB of JSON), and
    every request in flight held its own copy. Runs in a worker thread with the read.
    """

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self._last: tuple[needlecast.ParseResult, bytes] | None = None

    def body(self) -> bytes:
        result = self.mailbox.read()
        last = self._last
        if last is not None and last[0] is result:
            return last[1]
        encoded = json.dumps(
            {
                "messages": [m.to_json() for m in result.messages],
                "warnings": list(result.warnings),
                "truncated": result.truncated,
            }
        ).encode()
        self._last = (result, encoded)
        return encoded

    async def handle(self, request: web.Request) -> web.Response:
        async def work() -> web.Response:
            body = await asyncio.to_thread(self.body)
            return web.Response(body=body, content_type="application/json")

        return await _guarded(work)


async def _ack_outbox(request: web.Request) -> web.Response:
    mailbox = request.app[MAILBOXES].outbox

    async def work() -> web.Response:
        body = await _read_json(request)
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise _BadRequest(400, 'body must be {"ids": [<message id>, ...]}')
        result = await asyncio.to_thread(mailbox.remove, ids)
        return web.json_response({"removed": result.removed, "unknown": len(result.unknown)})

    return await _guarded(work)


def _one_line(body: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _BadRequest(400, f"{key!r} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS or needlecast.has_bad_header_chars(value):
        raise _BadRequest(400, f"{key!r} must be one line of printable text, <= {MAX_NAME_CHARS}")
    return value


async def _post_inbox(request: web.Request) -> web.Response:
    mailbox = request.app[MAILBOXES].inbox

    async def work() -> web.Response:
        body = await _read_json(request)
        if not isinstance(body, dict):
            raise _BadRequest(400, "body must be a JSON object")
        sender = _one_line(body, "from", required=True)
        kind = body.get("type")
        if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
            allowed = ", ".join(sorted(MESSAGE_TYPES))
            raise _BadRequest(400, f"'type' must be one of: {allowed}")
        content = body.get("content")
        if not isinstance(content, str):
            raise _BadRequest(400, "'content' must be a string")
        try:
            content.encode()
        except UnicodeEncodeError as exc:
            raise _BadRequest(400, "'content' holds a lone surrogate") from exc
        message = Message(
            id=needlecast.new_message_id(),
            sender=sender,
            type=kind,
            time=needlecast.utc_now(),
            body=content,
            to=_one_line(body, "to", required=False),
            thread=_one_line(body, "thread", required=False),
        )
        await asyncio.to_thread(mailbox.append, message)
        return web.json_response({"id": message.id, "timestamp": message.time}, status=201)

    return await _guarded(work)
