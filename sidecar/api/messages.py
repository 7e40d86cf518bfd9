"""HTTP routes for needlecast messages: GET /outbox, POST /outbox/ack, GET /inbox, POST /inbox.
File work is the mailbox store's, run in a worker thread since it takes a file lock; its errors
become statuses in `sidecar.api.app` (409, 507).
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib

from aiohttp import web
from msgspec import UnsetType

from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.core.contract import rfc3339
from sidecar.core.message_shapes import (
    AckRequest,
    AckResult,
    MessageAnswer,
    MessageCreated,
    MessageList,
    NewMessage,
)
from sidecar.security.acting import Owner
from sidecar.workspace import needlecast
from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import Message, ParseResult


@dataclasses.dataclass(frozen=True)
class Mailboxes:
    inbox: Mailbox
    outbox: Mailbox


MAILBOXES = web.AppKey("needlecast_mailboxes", Mailboxes)


def message_answer(m: Message) -> MessageAnswer:
    return MessageAnswer(
        id=m.id,
        from_=m.sender,
        to=m.to,
        thread=m.thread,
        type=m.type,
        content=m.body,
        timestamp=m.time,
    )


class _Listing:
    """GET /inbox or /outbox: the JSON answer, encoded once per parse of the file.

    `Mailbox.read()` hands back the same ParseResult while the file is unchanged; encoding it
    anew for every GET was most of the route's cost (1,000 messages are ~300 KB of JSON), and
    every request in flight held its own copy. An unchanged file (`Mailbox.peek`: one `stat`)
    is answered from the event loop; otherwise the read runs in a worker thread, one at a time
    (each still reads the file as it is when its turn comes, so a GET after a write sees it),
    so that a file that keeps changing never costs a parse's memory per request in flight.
    """

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self._last: tuple[ParseResult, bytes] | None = None
        self._reading = asyncio.Lock()

    def body(self) -> bytes:
        result = self.mailbox.read()
        last = self._last
        if last is not None and last[0] is result:
            return last[1]
        encoded = httpio.encode(
            MessageList(
                messages=[message_answer(m) for m in result.messages],
                warnings=list(result.warnings),
                truncated=result.truncated,
            )
        )
        self._last = (result, encoded)
        return encoded

    async def handle(self, request: web.Request) -> web.Response:
        last, peeked = self._last, self.mailbox.peek()
        if last is not None and peeked is last[0]:
            return httpio.raw_answer(last[1])
        async with self._reading:
            return httpio.raw_answer(await asyncio.to_thread(self.body))


async def _ack_outbox(request: web.Request) -> web.Response:
    body = await httpio.read_body(request, AckRequest)
    result = await asyncio.to_thread(request.app[MAILBOXES].outbox.remove, body.ids)
    return httpio.answer(AckResult(removed=result.removed, unknown=len(result.unknown)))


def _one_line(key: str, value: str | UnsetType) -> str | None:
    if isinstance(value, UnsetType):
        return None
    # The schema's pattern is ECMA's; this is the exact rule a header value must follow.
    if not value.strip() or needlecast.has_bad_header_chars(value):
        msg = f"invalid body: `{key}` must be one line of printable text, not blank"
        raise httpio.BadRequest(msg)
    return value


async def _post_inbox(request: web.Request) -> web.Response:
    body = await httpio.read_body(request, NewMessage)
    message = Message(
        id=needlecast.new_message_id(),
        sender=_one_line("from", body.from_),
        type=body.type,
        time=rfc3339(ms=False),
        body=body.content,
        to=_one_line("to", body.to),
        thread=_one_line("thread", body.thread),
    )
    await asyncio.to_thread(request.app[MAILBOXES].inbox.append, message)
    return httpio.answer(MessageCreated(id=message.id, timestamp=message.time or ""), status=201)


def message_operations(
    app: web.Application, workspace: pathlib.Path, owner: Owner | None = None
) -> list[Operation]:
    """The four message routes; files live in `<workspace>/.needlecast/`, handled as `owner`."""
    boxes = Mailboxes(
        inbox=Mailbox(workspace, "inbox", owner=owner),
        outbox=Mailbox(workspace, "outbox", owner=owner),
    )
    app[MAILBOXES] = boxes
    return [
        Operation(
            "GET",
            "/outbox",
            _Listing(boxes.outbox).handle,
            "getOutbox",
            "messages",
            "Messages the sleeve wrote for the envoy (`.needlecast/outbox.md`)",
            {200: MessageList},
            errors=(409,),
        ),
        Operation(
            "POST",
            "/outbox/ack",
            _ack_outbox,
            "ackOutbox",
            "messages",
            "Remove delivered messages from the outbox",
            {200: AckResult},
            description="Removes exactly the given ids; messages appended meanwhile stay.",
            body=AckRequest,
            errors=(400, 409),
        ),
        Operation(
            "GET",
            "/inbox",
            _Listing(boxes.inbox).handle,
            "getInbox",
            "messages",
            "Messages waiting for the sleeve (`.needlecast/inbox.md`)",
            {200: MessageList},
            errors=(409,),
        ),
        Operation(
            "POST",
            "/inbox",
            _post_inbox,
            "postInbox",
            "messages",
            "Deliver a message to the sleeve",
            {201: MessageCreated},
            description="The sidecar fills in `id` and the time.",
            body=NewMessage,
            errors=(400, 409, 507),
        ),
    ]
