"""The shapes of the sleeve's messages (`/outbox`, `/inbox`), split from `sidecar.core.shapes`
(whose bases they use): a message as read from its file, a new one, an acknowledgement.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, UnsetType, field

from sidecar.core.contract import MessageType
from sidecar.core.shapes import Answer, Count, OneLine, Request, Timestamp


class MessageAnswer(Answer):
    """A message as read from its file. A hand-written file may lack `from`, `type` or `time`
    (null here) or use another type; such messages are passed through and named in `warnings`."""

    id: str
    from_: Annotated[str | None, Meta(description="sender")] = field(name="from")
    to: Annotated[str | None, Meta(description="recipient; null: the envoy decides")]
    thread: Annotated[str | None, Meta(description="conversation this message belongs to")]
    type: Annotated[str | None, Meta(description="one of the message types, as written")]
    content: Annotated[str, Meta(description="markdown body")]
    timestamp: Annotated[Timestamp | None, Meta(description="the message's `time`")]


class MessageList(Answer):
    """The messages of one message file, in file order."""

    messages: list[MessageAnswer]
    warnings: Annotated[list[str], Meta(description="problems in the message file (line N: ...)")]
    truncated: Annotated[
        bool, Meta(description="the file is over the read limit; only its start was read")
    ]


class NewMessage(Request):
    """A message for the sleeve's inbox; the sidecar fills in `id` and `time`."""

    from_: Annotated[OneLine, Meta(description="sender")] = field(name="from")
    type: MessageType
    content: str
    to: Annotated[OneLine, Meta(description="recipient")] | UnsetType = UNSET
    thread: Annotated[OneLine, Meta(description="conversation id")] | UnsetType = UNSET


class MessageCreated(Answer):
    """The message was stored."""

    id: Annotated[str, Meta(description="id given to the message")]
    timestamp: Timestamp


class AckRequest(Request):
    """Messages to remove from the outbox, by id."""

    ids: Annotated[list[str], Meta(description="ids of the messages to remove")]


class AckResult(Answer):
    """How many messages were removed."""

    removed: Count
    unknown: Annotated[int, Meta(ge=0, description="ids that were not in the outbox")]
