"""opencode's own server as the agent's state source (`state: events`): the TUI the sidecar starts
serves its API on a loopback port the sidecar picks, behind a password made for that launch; the
sidecar reads its event stream for the agent's state and session id, lists its permission
requests as approvals and replies through its own reply route. If the stream does not come up,
the agent's state falls back to the screen and pane activity, and `/status` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp

from sidecar.agent.approvals import Approvals, Withdrawn
from sidecar.agent.clis import opencode
from sidecar.agent.machine import AgentMachine
from sidecar.agent.registry import CLIDef
from sidecar.agent.statefile import AgentFiles
from sidecar.core.states import ProcState

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
COME_UP = 20.0  # seconds the CLI's server has to answer after a start (or after it went away)
CATCH_UP = 5.0  # seconds for the state before the stream (a stream made again, an adopted CLI)
# While it starts, its server may take a request and never answer it (measured on 1.18.33): a
# stream that has not said `server.connected` within this is made again.
FIRST_WORD = 1.0
RETRY = 0.1  # seconds between tries to reach it meanwhile
MAX_LINE = 4 * 1024 * 1024  # an event bigger than this (a huge tool output) ends the connection


def free_port(host: str = HOST) -> int:
    """A port nothing listens on now (the CLI binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


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
        on_lost: Callable[[], None],
    ) -> None:
        self.machine = machine
        self.files = files
        self.approvals = approvals
        self.on_idle = on_idle  # the agent went idle: an inbox notice may be due
        self.on_lost = on_lost  # the stream is gone for good: another source takes over
        self.active = False  # the running CLI uses this source
        self.warning: str | None = None  # why the state is not from the CLI's events
        self.turns = opencode.Turns()
        self._task: asyncio.Task[None] | None = None
        self._launched = False  # the CLI that runs was launched by us, not adopted
        self._replies: set[asyncio.Task[None]] = set()

    def use(self, cli: CLIDef) -> None:
        """The CLI that runs now (launched or adopted)."""
        self.active = cli.state == "events"

    def launch(self, cli: CLIDef, argv: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
        """The argv and added environment to start `cli` with: its server on a free loopback
        port behind a new password, and its pinned session resumed by id."""
        self.use(cli)
        record = self.files.record
        pinned = record.session_id if record.session_cli == cli.name else None
        port = free_port()
        password = secrets.token_urlsafe(32)
        self.files.update(
            session_id=pinned,
            session_cli=cli.name,
            events_url=f"http://{HOST}:{port}",
            events_password=password,
        )
        self.machine.session_id = pinned
        self._launched = True
        argv = opencode.launch_argv(argv, host=HOST, port=port, session_id=pinned)
        return argv, {opencode.PASSWORD_ENV: password}

    def process_changed(self, state: ProcState) -> None:
        if state is ProcState.RUNNING and self.active:
            self.warning = None
            self.turns = opencode.Turns(session_id=self.machine.session_id)
            self._stop_reading()
            self._task = asyncio.create_task(self._read(), name="opencode-events")
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

    async def _read(self) -> None:
        record = self.files.record
        if record.events_url is None or record.events_password is None:
            self._lost("no address of its server is known (started by an older sidecar)")
            return
        auth = {"Authorization": aiohttp.encode_basic_auth(opencode.USER, record.events_password)}
        timeout = aiohttp.ClientTimeout(total=None, connect=2, sock_read=None)
        async with aiohttp.ClientSession(
            record.events_url, headers=auth, timeout=timeout, read_bufsize=MAX_LINE
        ) as http:
            deadline = time.monotonic() + COME_UP
            why = "it did not answer"
            # A CLI just launched has done nothing yet; one adopted, or a stream that broke,
            # may have: its state is asked for first.
            missed, self._launched = not self._launched, False
            while time.monotonic() < deadline:
                try:
                    async with asyncio.timeout(FIRST_WORD):
                        response = await http.get("/event")
                        events = sse_events(response)
                        first = await anext(events, None) if response.status == 200 else None
                    async with response:
                        if first is None:
                            why = f"its server answered {response.status}"
                        else:
                            await self._follow(http, events, missed=missed)
                            why, missed = "its event stream ended", True
                            deadline = time.monotonic() + COME_UP
                except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
                    why = f"its server is unreachable ({exc.__class__.__name__})"
                await asyncio.sleep(RETRY)
            self._lost(f"{why} within {COME_UP:g} s")

    async def _follow(
        self, http: aiohttp.ClientSession, events: AsyncIterator[dict[str, Any]], *, missed: bool
    ) -> None:
        """Catch up with what went before the stream (`missed`), then apply every event."""
        log.info("opencode events: reading %s", self.files.record.events_url)
        if missed:
            await self._catch_up(http)
        async for event in events:
            self._event(http, event)

    async def _catch_up(self, http: aiohttp.ClientSession) -> None:
        """The sessions at work and the permission requests open now. opencode leaves a
        request made while it starts unanswered: bounded, and skipped when it is."""
        try:
            async with asyncio.timeout(CATCH_UP):
                async with http.get("/session/status") as status:
                    busy = await status.json() if status.status == 200 else {}
                async with http.get("/permission") as pending:
                    asks = await pending.json() if pending.status == 200 else []
        except (aiohttp.ClientError, ValueError, TimeoutError) as exc:
            log.warning("opencode events: no catching up (%s)", exc.__class__.__name__)
            return
        asks = asks if isinstance(asks, list) else []
        effect = self.turns.sync(busy if isinstance(busy, dict) else {}, asks)
        for item in asks:
            if isinstance(item, dict):
                self._asked(http, item)
        self._report(effect)

    def _event(self, http: aiohttp.ClientSession, event: dict[str, Any]) -> None:
        props = event.get("properties")
        if not isinstance(props, dict):
            return
        kind = event.get("type")
        if kind == "permission.asked":
            self._asked(http, props)
        elif kind == "permission.replied" and (found := opencode.replied(props)):
            approval = self.approvals.by_key(found[0])
            if approval is not None:  # not ours: a person answered in the TUI first
                self.approvals.answered_by_terminal(approval.id, found[1])
        effect = self.turns.apply(event)
        if effect.state is not None:
            self._report(effect)

    def _report(self, effect: opencode.Effect) -> None:
        if effect.session_id is not None:
            self.machine.session_id = effect.session_id
            self.files.update(session_id=effect.session_id)
        if effect.state is None:
            return
        self.machine.report(effect.state, effect.reason)
        if effect.state == "idle":
            self.on_idle()

    def _lost(self, why: str) -> None:
        self.warning = (
            f"opencode's event stream: {why}; the agent's state comes from the screen and "
            "pane activity, its permission prompts are answered on screen"
        )
        log.warning("%s", self.warning)
        self.approvals.withdraw_all("opencode's event stream is gone")
        self.active = False
        self.on_lost()

    # ---- permission requests -----------------------------------------------------------------

    def _asked(self, http: aiohttp.ClientSession, props: Mapping[str, Any]) -> None:
        ask = opencode.permission_ask(props)
        if ask is None or self.approvals.by_key(ask.key) is not None:
            return
        approval = self.approvals.request(ask.tool, ask.input, source="events", key=ask.key)
        task = asyncio.create_task(self._reply(http, approval.id, ask.key), name="opencode-reply")
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _reply(self, http: aiohttp.ClientSession, approval_id: str, key: str) -> None:
        """Wait for the request's answer and give it to opencode (unless it came from there)."""
        try:
            answer = await self.approvals.decision(approval_id)
        except Withdrawn:
            return
        if answer.by == "terminal":
            return
        body = opencode.reply_body(answer)
        try:
            async with http.post(f"/permission/{key}/reply", json=body) as response:
                if response.status != 200:
                    text = (await response.text())[:200]
                    log.warning(
                        "opencode refused the reply to %s: %s %s", key, response.status, text
                    )
        except aiohttp.ClientError as exc:
            log.warning("cannot reply to opencode's permission request %s: %s", key, exc)
