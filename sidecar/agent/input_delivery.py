"""`POST /input`: check the agent's state, hold keys until a fresh prompt can take them, type,
and confirm that the agent left `waiting`. One writer to the pane at a time: the lock is shared
with the inbox notices.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection

from msgspec import UnsetType

from sidecar.agent.machine import AgentMachine
from sidecar.core.contract import AgentStateName
from sidecar.core.shapes import InputAccepted, InputRequest
from sidecar.core.states import ProcState
from sidecar.pane.control import PaneActivity
from sidecar.pane.send import PaneInput, check_text

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


class InputDelivery:
    def __init__(
        self, machine: AgentMachine, activity: PaneActivity, pane: PaneInput, lock: asyncio.Lock
    ) -> None:
        self.machine = machine
        self.activity = activity
        self.pane = pane
        self.lock = lock  # one writer to the pane at a time: inputs and notices
        # Why text is refused whatever the state (the budget is spent); None: it is not.
        self.refuse_text: Callable[[], str | None] = lambda: None

    def _require_running(self) -> None:
        if self.machine.process is not ProcState.RUNNING:
            msg = "the CLI is not running"
            raise NotRunning(msg)

    async def deliver(self, request: InputRequest) -> InputAccepted:
        """Check, hold keys for a fresh prompt, type, confirm."""
        text = None if isinstance(request.text, UnsetType) else request.text
        keys = None if isinstance(request.keys, UnsetType) else list(request.keys)
        wanted = None if isinstance(request.if_state, UnsetType) else set(request.if_state)
        data = check_text(text) if text is not None else b""
        refused = self.refuse_text() if text is not None else None
        if refused is not None:
            raise StateMismatch(refused)
        async with self.lock:
            self._require_running()
            held = 0.0
            self._check_state(wanted, text=keys is None)  # at once: no hold for unsent keys
            answering = keys is not None and self.machine.state == "waiting"
            if answering:
                held = await self._hold_for_prompt()
            state = self._check_state(wanted, text=keys is None)  # and right before delivery
            self._require_running()
            if keys is not None:
                await asyncio.to_thread(self.pane.keys, keys)
            else:
                submit = True if isinstance(request.submit, UnsetType) else request.submit
                await asyncio.to_thread(self.pane.paste, data, submit=submit)
            changed = None
            if answering and state == "waiting":
                changed = await self._left_waiting()
            return InputAccepted(
                delivered=True, agent=self.machine.state, held=round(held, 3), changed=changed
            )

    def _check_state(self, wanted: Collection[str] | None, *, text: bool) -> AgentStateName:
        state = self.machine.state
        if wanted is not None and state not in wanted:
            msg = f"the agent is {state}, not {' or '.join(sorted(wanted))}"
            raise StateMismatch(msg)
        if text and state == "waiting" and wanted is None:
            # A prompt typed into a dialog is lost (or answers it): only a client that says it
            # means the dialog (`if_state` with `waiting`) types text there. Keys answer it.
            what = self.machine.status().reason or "a dialog"
            msg = (
                f"the agent is waiting ({what}): text is not typed into a dialog; answer it "
                'with "keys", or pass "if_state" with "waiting" to type into it'
            )
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
            if self.machine.screen_needs_person and self.activity.quiet_for() >= HOLD_QUIET:
                break  # seen on screen, and nothing drawn since for a while: it takes keys now
            if now - since >= HOLD_MAX or self.machine.state != "waiting":
                break
            await asyncio.sleep(HOLD_POLL)  # sleep-ok: the polling interval of a bounded hold
        return time.monotonic() - started

    async def _left_waiting(self) -> bool:
        deadline = time.monotonic() + CONFIRM
        while self.machine.state == "waiting":
            left = deadline - time.monotonic()
            if left <= 0 or not await self.machine.wait_change(left):
                return self.machine.state != "waiting"
        return True
