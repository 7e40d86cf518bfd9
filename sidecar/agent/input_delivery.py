"""`POST /input`: check the agent's state, hold keys until a fresh prompt can take them, type
(text, keys, or a dialog's choice read again from the screen), and confirm that the agent left
`waiting`. One writer to the pane at a time: the lock is shared with the inbox notices.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection

from msgspec import UnsetType

from sidecar.agent.machine import AgentMachine
from sidecar.agent.prompt_submit import PromptSubmit
from sidecar.agent.screen_choices import Choice
from sidecar.agent.screens import Reading
from sidecar.core.contract import AgentStateName
from sidecar.core.shapes import InputAccepted, InputRequest
from sidecar.core.states import ProcState
from sidecar.pane.control import PaneActivity
from sidecar.pane.send import PaneInput, check_text

# Keys for a prompt that has just appeared. A CLI whose package says when its prompt takes keys
# (`ScreenKnowledge.keys_after`: seconds after it is drawn) gets them as soon as the prompt has
# been on screen that long. For the others, keys wait until the pane has been quiet for
# HOLD_QUIET after drawing something, and at least HOLD_MIN after `waiting` began (Claude Code
# 2.1.330 draws its permission prompt 0.1-0.6 s after the PermissionRequest hook). Never longer
# than HOLD_MAX.
HOLD_MIN, HOLD_QUIET, HOLD_MAX = 0.6, 0.5, 3.0
CONFIRM = 2.0  # seconds to watch for the agent leaving `waiting` after keys were sent
# While it watches, the screen is looked at this often besides on every output (only a whole
# frame counts, as on output: `sidecar.agent.screen_source`).
LOOK_EVERY = 0.02
HOLD_POLL = 0.05  # polling interval of the hold (it only runs while keys wait)


class NotRunning(Exception):
    """The CLI is not running: nothing can be typed into it (409)."""


class StateMismatch(Exception):
    """`if_state` did not hold at delivery (409)."""


class InputDelivery:
    def __init__(
        self,
        machine: AgentMachine,
        activity: PaneActivity,
        pane: PaneInput,
        lock: asyncio.Lock,
        read: Callable[[], Awaitable[Reading]],
        *,
        look: Callable[[], None],
        submit: PromptSubmit,
    ) -> None:
        self.machine = machine
        self.activity = activity
        self.pane = pane
        self.submit = submit  # text is typed through it: a prompt's submission confirmed
        self.lock = lock  # one writer to the pane at a time: inputs and notices
        self.read = read  # the screen as the running CLI's recognizer reads it, now
        self.look = look  # have the screen looked at (it tells the machine what it shows)
        self.keys_after: float | None = None  # the running CLI's (`ScreenKnowledge`)
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
        choice = None if isinstance(request.choice, UnsetType) else request.choice
        wanted = None if isinstance(request.if_state, UnsetType) else set(request.if_state)
        data = check_text(text) if text is not None else b""
        refused = self.refuse_text() if text is not None else None
        if refused is not None:
            raise StateMismatch(refused)
        async with self.lock:
            self._require_running()
            held = 0.0
            self._check_state(wanted, text=text is not None)  # at once: no hold for unsent keys
            if choice is not None and self.machine.state != "waiting":
                msg = f"no dialog to answer: the agent is {self.machine.state}"
                raise StateMismatch(msg)
            answering = text is None and self.machine.state == "waiting"
            if answering:
                held = await self._hold_for_prompt()
            state = self._check_state(wanted, text=text is not None)  # and right before delivery
            self._require_running()
            if choice is not None:
                await self._give(await self._choice(choice))
            elif keys is not None:
                await asyncio.to_thread(self.pane.keys, keys)
            else:
                submit = True if isinstance(request.submit, UnsetType) else request.submit
                await self.submit.paste(data, submit=submit)
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

    async def _choice(self, label: str) -> Choice:
        """The dialog's choice `label` as the screen shows it now (its keys follow the
        selection), or StateMismatch when the dialog on screen no longer offers it."""
        reading = await self.read()
        found = next((c for c in reading.choices if c.label == label), None)
        if found is None:
            offered = ", ".join(repr(c.label) for c in reading.choices) or "nothing to pick"
            msg = f"the dialog on screen does not offer {label!r} (it offers {offered})"
            raise StateMismatch(msg)
        return found

    async def _give(self, choice: Choice) -> None:
        if choice.text is not None:
            await asyncio.to_thread(self.pane.paste, check_text(choice.text), submit=True)
        else:
            await asyncio.to_thread(self.pane.keys, choice.keys)

    def _ready(self, since: float) -> float:
        """Seconds still to wait before the prompt takes keys (0: now)."""
        drawn = self.machine.drawn_for
        if drawn is not None and self.keys_after is not None:
            return max(self.keys_after - drawn, 0.0)  # the CLI's own rule, from its package
        if self.activity.quiet_for() < HOLD_QUIET:
            return HOLD_POLL
        last = self.activity.last_output
        if time.monotonic() - since >= HOLD_MIN and last is not None and last >= since:
            return 0.0  # drawn since `waiting` began, and quiet for a while
        # Seen on screen, and nothing drawn since for a while: it takes keys now.
        return 0.0 if drawn is not None else HOLD_POLL

    async def _hold_for_prompt(self) -> float:
        started = time.monotonic()
        since = self.machine.since_monotonic
        while (wait := self._ready(since)) > 0:
            if time.monotonic() - since >= HOLD_MAX or self.machine.state != "waiting":
                break
            # sleep-ok: the polling interval of a bounded hold, or the rest of a known one
            await asyncio.sleep(min(wait, HOLD_POLL))
        return time.monotonic() - started

    async def _left_waiting(self) -> bool:
        deadline = time.monotonic() + CONFIRM
        while self.machine.state == "waiting":
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.look()  # did the dialog take the keys? Its screen says so first
            await self.machine.wait_change(min(left, LOOK_EVERY))
        return True
