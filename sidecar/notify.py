"""Inbox notices: when the agent is idle and `.needlecast/inbox.md` holds messages it has not been
told about, one line saying so is typed into the CLI and submitted (CLIs marked `prompt: true`,
with `SIDECAR_INBOX_NOTIFY=idle`).

Each message is announced once: the ids told are kept in the state dir (`agent_files`), so a
restarted sidecar does not announce them again, and ids no longer in the inbox (acked, removed)
are forgotten. Messages appended while a notice is typed are announced by the next one. Never
while the agent is working or waiting: the state is checked under the same lock as `POST
/input`, right before typing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sidecar.agent import one_line
from sidecar.mailbox import NEEDLECAST_DIR
from sidecar.needlecast import Message

log = logging.getLogger(__name__)

FIRST_LINE = 120  # characters of a message's first line quoted in the notice


def _first_line(message: Message) -> str:
    for line in message.body.splitlines():
        if line.strip():
            return one_line(line.strip("# "), FIRST_LINE)
    return "(empty)"


def notice(messages: Sequence[Message]) -> str:
    """The one line typed for these (new) messages, oldest first."""
    first = messages[0]
    where = f"{NEEDLECAST_DIR}/inbox.md"
    who = one_line(first.sender or "unknown sender", 60)
    kind = one_line(first.type or "message", 20)
    quoted = _first_line(first).replace('"', "'")
    if len(messages) == 1:
        return (
            f'[sidecar] New inbox message from {who} ({kind}): "{quoted}". '
            f"Read it in {where} (id {one_line(first.id, 80)})."
        )
    return (
        f"[sidecar] {len(messages)} new inbox messages; the first from {who} ({kind}): "
        f'"{quoted}". Read them in {where}.'
    )


def unannounced(messages: Sequence[Message], announced: Sequence[str]) -> list[Message]:
    told = set(announced)
    return [m for m in messages if m.id not in told]


def still_there(messages: Sequence[Message], announced: Sequence[str]) -> list[str]:
    """The announced ids that are still in the inbox (the others are forgotten)."""
    present = {m.id for m in messages}
    return [i for i in announced if i in present]
