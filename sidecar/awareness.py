"""Agent awareness, wired together: the state machine (`agent`) fed by the CLI's source (Claude
Code's hooks, or pane activity), typing into the pane (`pane_input`) under one lock shared with
the inbox notices (`notify`), and what must survive a supervisor restart (`agent_files`).

The supervisor calls three things: `launch_argv` when it starts a CLI, `process_changed` when the
CLI's process state changes, `tick` once a second. The API calls `deliver` (POST /input) and
`hook` (POST /hooks/claude-code/<event>).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from msgspec import UnsetType

from sidecar import claude_hooks, notify
from sidecar.acting import Owner, acting
from sidecar.activity import SAMPLE, PaneActivity
from sidecar.agent import AgentMachine, AgentState
from sidecar.agent_files import AgentFiles
from sidecar.clis import CLIDef
from sidecar.config import Config, InboxNotify
from sidecar.events import EventBus
from sidecar.files import write_new
from sidecar.mailbox import Mailbox
from sidecar.pane_input import PaneInput, check_text
from sidecar.shapes import InboxNotified, InputAccepted, InputRequest
from sidecar.states import ProcState
from sidecar.tmux import Tmux

log = logging.getLogger(__name__)

# Keys for a prompt that has just appeared: Claude Code 2.1.330 draws its permission prompt
# 0.1-0.6 s after the PermissionRequest hook and drops keys that come before or within ~0.1 s
# of the drawing (measured). So keys wait until the pane has been quiet for HOLD_QUIET after
# drawing something, and at least HOLD_MIN after `waiting` began; never longer than HOLD_MAX.
HOLD_MIN, HOLD_QUIET, HOLD_MAX = 0.6, 0.5, 3.0
CONFIRM = 2.0  # seconds to watch for the agent leaving `waiting` after keys were sent
HOLD_POLL = 0.05  # polling interval of the hold (it only runs while keys wait)


class NotRunning(Exception):
    """The CLI is not running: nothing can be typed into it (409)."""


class StateMismatch(Exception):
    """`if_state` did not hold at delivery (409)."""


class Awareness:
    def __init__(self, config: Config, bus: EventBus, tmux: Tmux) -> None:
        self.config = config
        self.bus = bus
        self.machine = AgentMachine(bus)
        self.files = AgentFiles(config.paths.agent_state)
        record = self.files.load()
        self.machine.session_id = record.session_id
        self.activity = PaneActivity(tmux, self._on_output)
        self.pane = PaneInput(tmux)
        self.inbox = Mailbox(config.workspace, "inbox")
        self.lock = asyncio.Lock()  # one writer to the pane at a time: inputs and notices
        # Where the CLI's user reads it (the session dir with SIDECAR_USER), as that user's.
        self.settings_path = config.paths.claude_settings
        self._settings_owner = (
            Owner(config.user.uid, config.user.gid, act_as=True) if config.user else None
        )
        self._cli: CLIDef | None = None
        self._launched_at = time.monotonic()
        self._quiet_timer: asyncio.TimerHandle | None = None
        self._inbox_seen: tuple[int, int, int] | None = None
        self._notifying = False
        self._task: asyncio.Task[None] | None = None

    # ---- the supervisor's side -----------------------------------------------------------------

    def launch_argv(
        self, cli: CLIDef, argv: tuple[str, ...], env: Mapping[str, str], *, has_history: bool
    ) -> tuple[str, ...]:
        """The argv to start `cli` with (`argv`: the registry's; `env`: the CLI's environment):
        Claude Code gets our hook settings and its pinned session. A new hook secret for every
        launch."""
        self._cli = cli
        self._launched_at = time.monotonic()
        self.machine.launched(cli.state)
        if cli.state != "hooks":
            self.files.update(hook_secret=None)
            return argv
        record = self.files.record
        config_dir = (
            Path(env["CLAUDE_CONFIG_DIR"])
            if env.get("CLAUDE_CONFIG_DIR")
            else Path(env.get("HOME", "/root")) / ".claude"
        )
        pinned = record.session_id if record.session_cli == cli.name else None
        args, session = claude_hooks.session_args(
            pinned, self.config.workspace, config_dir, has_history=has_history
        )
        secret = secrets.token_urlsafe(32)
        self.files.update(session_id=session, session_cli=cli.name, hook_secret=secret)
        self.machine.session_id = session
        base = claude_hooks.hook_base_url(self.config.host, self.config.port)
        document = claude_hooks.settings(base, secret, self.settings_path)
        # The file holds the secret: 0600, made as the CLI's user (with SIDECAR_USER; the
        # sidecar keeps the secret in memory and in its own state dir, never reads it back).
        with acting(self._settings_owner):
            write_new(self.settings_path, json.dumps(document, indent=1).encode(), 0o600)
        return (*cli.command, "--settings", str(self.settings_path), *args)

    def process_changed(self, state: ProcState, cli: CLIDef | None) -> None:
        if self._cli is None and cli is not None and state is ProcState.RUNNING:
            # A CLI this supervisor did not launch (adopted after a restart): same source.
            self._cli = cli
            self.machine.launched(cli.state)
        if state is ProcState.STOPPING and self.files.record.hook_secret is not None:
            # Hooks of a CLI being stopped are refused from here on (a resleeve's old CLI).
            self.files.update(hook_secret=None)
        self.machine.process_changed(state)
        if state is ProcState.RUNNING:
            self.activity.attach()
        if state is ProcState.RUNNING and self._cli is not None and self._cli.state == "activity":
            self._arm_quiet(self.config.activity_quiet)

    def start(self) -> None:
        self._task = asyncio.create_task(self.activity.run(), name="activity")

    async def stop(self) -> None:
        if self._quiet_timer is not None:
            self._quiet_timer.cancel()
        await self.activity.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def tick(self) -> None:
        """Once a second (the supervisor's tick): a notice, if one is due."""
        self._maybe_notify()

    # ---- sources -------------------------------------------------------------------------------

    def _on_output(self, now: float) -> None:
        cli = self._cli
        if cli is None or cli.state != "activity":
            return
        # Output: a turn is under way. Quiet for `activity_quiet` seconds: idle.
        self.machine.report(AgentState.WORKING)
        if self._quiet_timer is None:
            self._arm_quiet(self.config.activity_quiet)

    def _arm_quiet(self, delay: float) -> None:
        if self._quiet_timer is not None:
            self._quiet_timer.cancel()
        self._quiet_timer = asyncio.get_running_loop().call_later(delay, self._check_quiet)

    def _check_quiet(self) -> None:
        self._quiet_timer = None
        cli = self._cli
        if cli is None or cli.state != "activity":
            return
        quiet = self.config.activity_quiet
        since = min(self.activity.quiet_for(), time.monotonic() - self._launched_at)
        if since + SAMPLE / 2 >= quiet:
            self.machine.report(AgentState.IDLE)
            self._maybe_notify()
        else:
            self._arm_quiet(quiet - since)

    def hook_secret_matches(self, given: str | None) -> bool:
        """Constant-time check of a hook call's secret against the running CLI's."""
        expected = self.files.record.hook_secret
        if given is None or expected is None:
            return False
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode())

    def hook(self, event: str, payload: dict[str, Any]) -> None:
        """A hook event from the running Claude Code (its secret was checked)."""
        effect = claude_hooks.interpret(event, payload)
        if effect.session_id is not None and effect.session_id != self.machine.session_id:
            # --continue picked a conversation: pin it from now on.
            self.machine.session_id = effect.session_id
            self.files.update(session_id=effect.session_id)
        if effect.state is None:
            return
        reason = effect.reason
        if (
            event == "Notification"
            and effect.state is AgentState.WAITING
            and self.machine.state is AgentState.WAITING
        ):
            reason = self.machine.status().reason  # the hook's own reason names the tool
        self.machine.report(effect.state, reason)
        if effect.state is AgentState.IDLE:
            self._maybe_notify()

    # ---- typing ----------------------------------------------------------------------------------

    def _process_running(self) -> bool:
        return self.machine.process is ProcState.RUNNING

    async def deliver(self, request: InputRequest) -> InputAccepted:
        """POST /input: check, hold keys for a fresh prompt, type, confirm."""
        text = None if isinstance(request.text, UnsetType) else request.text
        keys = None if isinstance(request.keys, UnsetType) else list(request.keys)
        wanted = None if isinstance(request.if_state, UnsetType) else set(request.if_state)
        data = check_text(text) if text is not None else b""
        async with self.lock:
            if not self._process_running():
                msg = "the CLI is not running"
                raise NotRunning(msg)
            held = 0.0
            self._check_state(wanted)  # at once: no hold for keys that will not be sent
            answering = keys is not None and self.machine.state is AgentState.WAITING
            if answering:
                held = await self._hold_for_prompt()
            state = self._check_state(wanted)  # and again right before delivery
            if not self._process_running():
                msg = "the CLI is not running"
                raise NotRunning(msg)
            if keys is not None:
                await asyncio.to_thread(self.pane.keys, keys)
            else:
                submit = True if isinstance(request.submit, UnsetType) else request.submit
                await asyncio.to_thread(self.pane.paste, data, submit=submit)
            changed = None
            if answering and state is AgentState.WAITING:
                changed = await self._left_waiting()
            return InputAccepted(
                delivered=True, agent=self.machine.state.value, held=round(held, 3), changed=changed
            )

    def _check_state(self, wanted: Collection[str] | None) -> AgentState:
        state = self.machine.state
        if wanted is not None and state.value not in wanted:
            msg = f"the agent is {state.value}, not {' or '.join(sorted(wanted))}"
            raise StateMismatch(msg)
        return state

    async def _hold_for_prompt(self) -> float:
        started = time.monotonic()
        since = self.machine.since_monotonic
        while True:
            now = time.monotonic()
            last = self.activity.last_output
            drawn = last is not None and last >= since
            if now - since >= HOLD_MIN and drawn and self.activity.quiet_for() >= HOLD_QUIET:
                break
            if now - since >= HOLD_MAX or self.machine.state is not AgentState.WAITING:
                break
            await asyncio.sleep(HOLD_POLL)  # sleep-ok: the polling interval of a bounded hold
        return time.monotonic() - started

    async def _left_waiting(self) -> bool:
        deadline = time.monotonic() + CONFIRM
        while self.machine.state is AgentState.WAITING:
            left = deadline - time.monotonic()
            if left <= 0 or not await self.machine.wait_change(left):
                return self.machine.state is not AgentState.WAITING
        return True

    # ---- inbox notices ---------------------------------------------------------------------------

    def _maybe_notify(self) -> None:
        cli = self._cli
        if (
            self.config.inbox_notify is not InboxNotify.IDLE
            or cli is None
            or not cli.prompt
            or self.machine.state is not AgentState.IDLE
            or self._notifying
            or self.lock.locked()
        ):
            return
        try:
            st = os.stat(self.inbox.path)
        except OSError:
            return
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen == self._inbox_seen:
            return  # nothing new since the last look
        self._notifying = True
        task = asyncio.create_task(self._notify(seen), name="inbox-notice")
        task.add_done_callback(self._notified)

    def _notified(self, task: asyncio.Task[None]) -> None:
        self._notifying = False
        if not task.cancelled() and task.exception() is not None:
            log.error("inbox notice failed", exc_info=task.exception())

    async def _notify(self, seen: tuple[int, int, int]) -> None:
        result = await asyncio.to_thread(self.inbox.read)
        announced = notify.still_there(result.messages, self.files.record.announced)
        fresh = notify.unannounced(result.messages, announced)
        if announced != self.files.record.announced:
            self.files.update(announced=announced)
        if not fresh:
            self._inbox_seen = seen
            return
        line = notify.notice(fresh)
        async with self.lock:
            # Checked again under the lock: a prompt may have come in meanwhile.
            if self.machine.state is not AgentState.IDLE or not self._process_running():
                return
            await asyncio.to_thread(self.pane.paste, line.encode(), submit=True)
        ids = [m.id for m in fresh]
        self.files.update(announced=[*announced, *ids])
        self._inbox_seen = seen
        log.info("inbox notice typed for %s", ids)
        self.bus.publish(InboxNotified(ids=ids, text=line))
