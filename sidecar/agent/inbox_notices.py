"""Inbox notices: when the agent is idle and `.needlecast/inbox.md` holds messages it has not been
told about, one line saying so is typed into the CLI and submitted (CLIs marked `prompt: true`,
with `SIDECAR_INBOX_NOTIFY=idle`). Each message is announced once, never while the agent works.
The inbox is looked at as the CLI's user (the `Mailbox`'s owner); a failure is logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from sidecar.agent.machine import AgentMachine
from sidecar.agent.prompt_submit import PromptSubmit
from sidecar.agent.statefile import AgentFiles
from sidecar.config import InboxNotify
from sidecar.core.event_shapes import InboxNotified
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.core.text import one_line
from sidecar.workspace.mailbox import NEEDLECAST_DIR, Mailbox, NeedlecastError
from sidecar.workspace.needlecast import Message

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


class InboxNotices:
    """Types a notice when one is due (`check`: on going idle, and once a second). The ids told
    are kept in the state dir (`agent_files`), so a restarted sidecar does not announce them
    again; ids no longer in the inbox (acked, removed) are forgotten. Messages appended while a
    notice is typed are announced by the next one."""

    def __init__(
        self,
        mode: InboxNotify,
        machine: AgentMachine,
        *,
        files: AgentFiles,
        inbox: Mailbox,
        submit: PromptSubmit,
        lock: asyncio.Lock,
        bus: EventBus,
    ) -> None:
        self.mode = mode
        self.machine = machine
        self.files = files
        self.inbox = inbox
        self.submit = submit
        self.lock = lock  # one writer to the pane at a time: inputs and notices
        self.bus = bus
        self.prompt = False  # whether the CLI that runs takes typed lines
        self._seen: tuple[int, int, int] | None = None  # the inbox as last looked at
        self._notifying = False
        self._failure: str | None = None  # the failure last logged: each one is logged once

    def check(self) -> None:
        """Start typing a notice if one is due; never while another write holds the pane."""
        if (
            self.mode is not InboxNotify.IDLE
            or not self.prompt
            or self.machine.state != "idle"
            or self._notifying
            or self.lock.locked()
        ):
            return
        try:
            st = self.inbox.stat()
        except FileNotFoundError:
            self._cleared()  # no inbox (yet): nothing to announce
            return
        except OSError as exc:  # once a second until it clears: logged once, not each time
            self._failed("cannot look at the inbox", exc)
            return
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._seen:
            self._cleared()  # as it was when last announced: nothing is failing
            return  # nothing new since the last look
        self._notifying = True
        task = asyncio.create_task(self._notify(seen), name="inbox-notice")
        task.add_done_callback(self._notified)

    def _notified(self, task: asyncio.Task[None]) -> None:
        self._notifying = False
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._cleared()
        else:
            self._failed("inbox notice failed", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        """Log a failure once: the next look (a second later) would meet it again."""
        text = f"{what}: {exc!r}"
        if text == self._failure:
            return
        self._failure = text
        if isinstance(exc, (OSError, NeedlecastError)):  # the file, not our code
            log.warning("%s; no notices until it clears", text)
        else:
            log.error("%s", what, exc_info=exc)

    def _cleared(self) -> None:
        if self._failure is not None:
            log.info("inbox notices work again (after: %s)", self._failure)
            self._failure = None

    async def _notify(self, seen: tuple[int, int, int]) -> None:
        result = await asyncio.to_thread(self.inbox.read)
        announced = still_there(result.messages, self.files.record.announced)
        fresh = unannounced(result.messages, announced)
        if announced != self.files.record.announced:
            self.files.update(announced=announced)
        if not fresh:
            self._seen = seen
            return
        line = notice(fresh)
        async with self.lock:
            # Checked again under the lock (as `POST /input` checks): a prompt may have come in
            # meanwhile.
            if self.machine.state != "idle" or self.machine.process is not ProcState.RUNNING:
                return
            await self.submit.paste(line.encode(), submit=True)
        ids = [m.id for m in fresh]
        self.files.update(announced=[*announced, *ids])
        self._seen = seen
        log.info("inbox notice typed for %s", ids)
        self.bus.publish(InboxNotified(ids=ids, text=line))
