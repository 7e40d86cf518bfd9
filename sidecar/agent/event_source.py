"""A CLI's own server as the agent's state source (`state: events`; what the CLI declares:
`sidecar.agent.event_stream`): the CLI the sidecar starts serves its API on a loopback port the
sidecar picks, behind a password made for that launch; the sidecar reads its event stream for the
agent's state and session id, lists its permission requests as approvals and replies through the
CLI's own reply route. If the stream does not come up, the agent's state falls back to the
screen and pane activity, and `/status` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from sidecar.agent.approvals import Approvals, Withdrawn
from sidecar.agent.event_stream import Bill, EventStream, Turns
from sidecar.agent.hooks import HookEffect, PermissionAsk
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.statefile import AgentFiles
from sidecar.core.loopback import free_port
from sidecar.core.states import ProcState
from sidecar.usage.reports import BadReport, UsageReport

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
COME_UP = 20.0  # seconds the CLI's server has to answer after a start (or after it went away)
CATCH_UP = 5.0  # seconds for the state before the stream (a stream made again, an adopted CLI)
# While it starts, its server may take a request and never answer it (measured on opencode
# 1.18.33): a stream that has not said its first event within this is made again.
FIRST_WORD = 1.0
RETRY = 0.1  # seconds between tries to reach it meanwhile
# Once it is given up for, it is still tried, less often: a server slow to come up (a busy
# machine) takes the state back from the screen when it does.
LATE_RETRY = 2.0
MAX_LINE = 4 * 1024 * 1024  # an event bigger than this (a huge tool output) ends the connection


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's `data:` fields."""
    data: list[str] = []
    while line := await response.content.readline():
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        if text.startswith("data:"):
            data.append(text[5:].removeprefix(" "))
        elif not text and data:
            with contextlib.suppress(ValueError):
                event = json.loads("\n".join(data))
                if isinstance(event, dict):
                    yield event
            data = []


class EventSource:
    def __init__(
        self,
        machine: AgentMachine,
        files: AgentFiles,
        approvals: Approvals,
        on_idle: Callable[[], None],
        *,
        on_lost: Callable[[], None],
        on_found: Callable[[], None],
    ) -> None:
        self.machine = machine
        self.files = files
        self.approvals = approvals
        self.on_idle = on_idle  # the agent went idle: an inbox notice may be due
        self.on_lost = on_lost  # the stream is given up for: another source takes over
        self.on_found = on_found  # ... and it came after all: this source takes over again
        self.stream: EventStream | None = None  # the running CLI's, when it uses this source
        self.name = ""  # the running CLI's knowledge name
        # Where the CLI launched last serves its API (a port of ours, for this launch alone).
        self.address: tuple[str, int] | None = None
        self.warning: str | None = None  # why the state is not from the CLI's events
        self.turns: Turns | None = None
        self.bill: Bill | None = None  # the run's model requests, when its events carry them
        self.on_usage: Callable[[UsageReport], None] = lambda _: None  # one model request
        self._task: asyncio.Task[None] | None = None
        self._launched = False  # the CLI that runs was launched by us, not adopted
        self._replies: set[asyncio.Task[None]] = set()

    @property
    def active(self) -> bool:
        """The running CLI uses this source."""
        return self.stream is not None

    def use(self, cli: CLIDef) -> None:
        """The CLI that runs now (launched or adopted)."""
        known = cli.knowledge
        self.stream = known.events if known is not None and cli.state == "events" else None
        self.name = known.name if known is not None else ""
        self.address = None

    def launch(self, cli: CLIDef, argv: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
        """The argv and added environment to start `cli` with: its server on a free loopback
        port behind a new password, and its pinned session resumed by id."""
        self.use(cli)
        stream = self.stream
        if stream is None:
            return argv, {}
        record = self.files.record
        pinned = record.session_id if record.session_cli == cli.name else None
        port = free_port(HOST)  # the CLI binds it a moment later
        self.address = (HOST, port)
        password = secrets.token_urlsafe(32)
        self.files.update(
            session_id=pinned,
            session_cli=cli.name,
            events_url=f"http://{HOST}:{port}",
            events_password=password,
        )
        self.machine.session_id = pinned
        self._launched = True
        return stream.launch(argv, HOST, port, pinned), {stream.password_env: password}

    def process_changed(self, state: ProcState) -> None:
        if state is ProcState.RUNNING and self.stream is not None:
            self.warning = None
            self.turns = self.stream.turns(self.machine.session_id)
            self.bill = self.stream.bill() if self.stream.bill is not None else None
            self._stop_reading()
            self._task = asyncio.create_task(self._read(self.stream), name=f"{self.name}-events")
        elif state is not ProcState.RUNNING:
            self._stop_reading()
            if state is ProcState.STOPPING:
                self.files.update(events_url=None, events_password=None)

    async def stop(self) -> None:
        task = self._task
        self._stop_reading()
        for t in [task, *self._replies]:
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    def _stop_reading(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    # ---- the stream --------------------------------------------------------------------------

    async def _read(self, stream: EventStream) -> None:
        record = self.files.record
        if record.events_url is None or record.events_password is None:
            self._lost("no address of its server is known (started by an older sidecar)")
            return
        auth = {"Authorization": aiohttp.encode_basic_auth(stream.user, record.events_password)}
        timeout = aiohttp.ClientTimeout(total=None, connect=2, sock_read=None)
        async with aiohttp.ClientSession(
            record.events_url, headers=auth, timeout=timeout, read_bufsize=MAX_LINE
        ) as http:
            deadline = time.monotonic() + COME_UP
            why = "it did not answer"
            # A CLI just launched has done nothing yet; one adopted, or a stream that broke,
            # may have: its state is asked for first.
            missed, self._launched = not self._launched, False
            while True:  # until the CLI stops (the task is cancelled then)
                if self.stream is not None and time.monotonic() >= deadline:
                    self._lost(f"{why} within {COME_UP:g} s")
                try:
                    async with asyncio.timeout(FIRST_WORD):
                        response = await http.get(stream.path)
                        events = sse_events(response)
                        first = await anext(events, None) if response.status == 200 else None
                    async with response:
                        if first is None:
                            why = f"its server answered {response.status}"
                        else:
                            if self.stream is None:
                                self._found(stream)
                                missed = True  # what the screen listed was withdrawn
                            await self._follow(http, stream, events, missed=missed)
                            why, missed = "its event stream ended", True
                            deadline = time.monotonic() + COME_UP
                except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
                    why = f"its server is unreachable ({exc.__class__.__name__})"
                await asyncio.sleep(RETRY if self.stream is not None else LATE_RETRY)

    async def _follow(
        self,
        http: aiohttp.ClientSession,
        stream: EventStream,
        events: AsyncIterator[dict[str, Any]],
        *,
        missed: bool,
    ) -> None:
        """Catch up with what went before the stream (`missed`), then apply every event."""
        log.info("%s events: reading %s", self.name, self.files.record.events_url)
        if missed:
            await self._catch_up(http, stream)
        async for event in events:
            self._event(http, stream, event)

    async def _catch_up(self, http: aiohttp.ClientSession, stream: EventStream) -> None:
        """What its status routes say is at work and open now. A CLI may leave a request made
        while it starts unanswered (opencode does): bounded, and skipped when it is."""
        documents: list[Any] = []
        try:
            async with asyncio.timeout(CATCH_UP):
                for path in stream.status:
                    async with http.get(path) as answer:
                        documents.append(await answer.json() if answer.status == 200 else None)
        except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
            log.warning("%s events: no catching up (%s)", self.name, exc.__class__.__name__)
            return
        if self.turns is None:
            return
        effect = self.turns.sync(documents)
        for ask in stream.pending(documents):
            self._asked(http, stream, ask)
        self._report(effect)

    def _event(
        self, http: aiohttp.ClientSession, stream: EventStream, event: dict[str, Any]
    ) -> None:
        if (ask := stream.asked(event)) is not None:
            self._asked(http, stream, ask)
        elif (found := stream.replied(event)) is not None:
            approval = self.approvals.by_key(found[0])
            if approval is not None:  # not ours: a person answered in the CLI first
                self.approvals.answered_by_terminal(approval.id, found[1])
        self._bill(event)
        effect = self.turns.apply(event) if self.turns is not None else HookEffect(None)
        if effect.state is not None:
            self._report(effect)

    def _bill(self, event: dict[str, Any]) -> None:
        try:
            usage = self.bill.read(event) if self.bill is not None else None
        except BadReport as exc:
            log.warning("%s events: a model request's usage not counted: %s", self.name, exc)
            return
        if usage is not None:
            self.on_usage(usage)

    def _report(self, effect: HookEffect) -> None:
        if effect.session_id is not None:
            self.machine.session_id = effect.session_id
            self.files.update(session_id=effect.session_id)
        if effect.state is None:
            return
        self.machine.report(effect.state, effect.reason)
        if effect.state == "idle":
            self.on_idle()

    def _found(self, stream: EventStream) -> None:
        self.stream, self.warning = stream, None
        log.warning(
            "%s's event stream answered after all: the agent's state comes from it", self.name
        )
        self.approvals.withdraw_all(f"{self.name}'s event stream lists its requests again")
        self.on_found()

    def _lost(self, why: str) -> None:
        self.warning = (
            f"{self.name}'s event stream: {why}; the agent's state comes from the screen and "
            "pane activity, its permission prompts are answered on screen"
        )
        log.warning("%s", self.warning)
        self.approvals.withdraw_all(f"{self.name}'s event stream is gone")
        self.stream = None
        self.on_lost()

    # ---- permission requests -----------------------------------------------------------------

    def _asked(self, http: aiohttp.ClientSession, stream: EventStream, ask: PermissionAsk) -> None:
        if ask.key is None or self.approvals.by_key(ask.key) is not None:
            return
        approval = self.approvals.request(ask.tool, ask.input, source="events", key=ask.key)
        task = asyncio.create_task(
            self._reply(http, stream, approval.id, ask.key), name=f"{self.name}-reply"
        )
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(
        self, http: aiohttp.ClientSession, stream: EventStream, approval_id: str, key: str
    ) -> None:
        """Wait for the request's answer and give it to the CLI (unless it came from there)."""
        try:
            answer = await self.approvals.decision(approval_id)
        except Withdrawn:
            return
        if answer.by == "terminal":
            return
        path, body = stream.reply(key, answer)
        try:
            async with http.post(path, json=body) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    log.warning(
                        "%s refused the reply to %s: %s %s", self.name, key, response.status, text
                    )
        except aiohttp.ClientError as exc:
            log.warning("cannot reply to %s's permission request %s: %s", self.name, key, exc)
