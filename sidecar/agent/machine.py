"""The agent's state (what the AI CLI is doing, not only whether its process runs): one machine,
fed by one source per CLI (its hooks, or pane activity), with the supervisor's process state on
top. The state names are the contract's (`AgentStateName`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sidecar.agent.screen_choices import Choice
from sidecar.agent.screens import Reading, Seen
from sidecar.core.contract import AGENT_STATES, AgentStateName, StateSource
from sidecar.core.event_shapes import AgentStateEvent
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.core.text import one_line

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentStatus:
    state: AgentStateName
    since: float  # wall-clock time (time.time()) the state began
    reason: str | None
    source: StateSource
    session_id: str | None
    choices: tuple[Choice, ...] = ()  # `waiting` on a dialog read on screen: its answers


class AgentMachine:
    """Owns the agent's state. Sources call `report`; the supervisor calls `launched` and
    `process_changed`; readers use `status`, `totals` and `wait_change`."""

    def __init__(self, bus: EventBus) -> None:
        self.bus = bus
        self.source: StateSource = "none"
        self._session_id: str | None = None
        self._process = ProcState.STOPPED
        self._process_why: str | None = None  # why the CLI does not run: `exited`'s reason
        # starting: launched, no sign yet; exited: the CLI process is not running (the
        # supervisor's word beats any source's); unknown: the CLI gives no signal.
        self._seen: AgentStateName = "starting"  # what the source last said
        self._seen_reason: str | None = None
        # What the screen showed at the last look since the source last spoke (None: no look
        # since), and whether a prompt the source announced has been on screen: only then can
        # its leaving the screen end `waiting` (the hook comes before the prompt is drawn).
        self._screen: Reading | None = None
        self._drawn = False
        self._drawn_at = 0.0  # time.monotonic() the prompt on screen was first seen there
        self.on_report: Callable[[], None] | None = None  # a source spoke: look again
        # The state changed (new, previous): a held permission request may be over.
        self.on_state: Callable[[AgentStateName, AgentStateName], None] | None = None
        self.on_look: Callable[[], None] | None = None  # the state or the screen's reading changed
        # Why the agent must wait whatever its source says (the budget is spent); None: no hold.
        self._hold: str | None = None
        self._state: AgentStateName = "exited"  # the effective state
        self._reason: str | None = None
        self._since = time.time()
        self._since_mono = time.monotonic()
        # Seconds in each state before the current one began: replaced, never changed in place,
        # so that a snapshot can keep the mapping it was given.
        self._totals: Mapping[str, float] = dict.fromkeys(AGENT_STATES, 0.0)
        self._status = self._make_status()
        self._changed = asyncio.Event()

    # ---- inputs ------------------------------------------------------------------------------

    def launched(self, source: StateSource) -> None:
        """A new CLI process was started: its source has said nothing yet."""
        self.source = source
        self._seen, self._seen_reason = (
            ("unknown", None) if source == "none" else ("starting", None)
        )
        self._screen, self._drawn = None, False
        self._status = self._make_status()  # the source is part of it, changed or not
        self._apply()

    def source_changed(self, source: StateSource) -> None:
        """The running CLI's state comes from another source from now on (its hooks never
        reported: the pane's activity); what it said so far stands."""
        self.source = source
        self._status = self._make_status()

    def process_changed(self, state: ProcState, why: str | None = None) -> None:
        """The supervisor's state of the CLI process changed (`why`: why it does not run)."""
        self._process = state
        self._process_why = one_line(why) if why else None
        self._apply()

    def report(self, state: AgentStateName, reason: str | None = None) -> None:
        """What the source sees now (ignored while the process is not running). The source's
        word is the latest: a look taken before it no longer counts."""
        if state != self._seen:
            self._drawn = False
            if self.source != "activity":  # activity's word comes from the pane itself
                self._screen = None
        self._seen = state
        self._seen_reason = one_line(reason) if reason else None
        self._apply()
        if self.on_report is not None:
            self.on_report()

    def hold(self, reason: str | None) -> None:
        """Keep the agent `waiting` for `reason` while the CLI runs, whatever its source and
        its screen say (the budget is spent); None lets it go on as they say."""
        self._hold = reason
        self._apply()

    def screen(self, reading: Reading) -> None:
        """What the screen shows now (a look after the pane settled, or after a source spoke)."""
        before = self._screen
        if reading.needs_person and (
            before is None or not before.needs_person or before.reason != reading.reason
        ):
            self._drawn_at = time.monotonic()  # a prompt for a person appeared (another one)
        self._screen = reading
        if reading.needs_person:
            self._drawn = True
        if reading.choices != self._status.choices:
            self._status = self._make_status()  # the same question, its answers read anew
        self._apply()
        if self.on_look is not None:
            self.on_look()

    # ---- the machine ---------------------------------------------------------------------------

    def _effective(self) -> tuple[AgentStateName, str | None]:
        if self._process is ProcState.RUNNING:
            return ("waiting", self._hold) if self._hold is not None else self._combined()
        if self._process is ProcState.STARTING:
            return "starting", None
        # Whatever the source says: a CLI that is not running is doing nothing.
        return "exited", self._process_why

    def _combined(self) -> tuple[AgentStateName, str | None]:
        """The source's word, as the screen confirms or corrects it: a dialog on screen is
        `waiting` whatever the source said; a prompt the source announced that has left the
        screen is over (back at the input prompt: `idle`; at work: `working`); a CLI adopted
        or just started reads as its screen shows it. `idle` is never reported over a dialog."""
        seen, reason, screen = self._seen, self._seen_reason, self._screen
        if screen is None or seen in ("exited", "unknown"):
            return seen, reason
        if screen.needs_person:
            # The source's own reason names the request more exactly, when it has one.
            return "waiting", reason if seen == "waiting" and reason else screen.reason
        if seen == "waiting":
            if not self._drawn:
                return seen, reason  # announced, not drawn yet
            return ("working" if screen.seen is Seen.WORKING else "idle"), None
        if seen == "starting":
            return ("working" if screen.seen is Seen.WORKING else "idle"), None
        return seen, reason

    def _apply(self) -> None:
        state, reason = self._effective()
        if state == self._state and reason == self._reason:
            return
        previous = self._state
        now_mono = time.monotonic()
        if state != previous:
            spent = self._totals[previous] + now_mono - self._since_mono
            self._totals = {**self._totals, previous: spent}
            self._since, self._since_mono = time.time(), now_mono
        self._state, self._reason = state, reason
        self._status = self._make_status()
        log.info("agent %s -> %s%s", previous, state, f" ({reason})" if reason else "")
        self.bus.publish(AgentStateEvent(state=state, previous=previous, reason=reason))
        if state != previous and self.on_state is not None:
            self.on_state(state, previous)
        if self.on_look is not None:
            self.on_look()
        # Wake everyone waiting for a change, then arm a fresh event for the next one.
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- readers -------------------------------------------------------------------------------

    @property
    def state(self) -> AgentStateName:
        return self._state

    @property
    def doing(self) -> AgentStateName:
        """What the agent does as its source and screen tell it, a hold aside."""
        if self._process is ProcState.RUNNING:
            return self._combined()[0]
        return self._state

    @property
    def reading(self) -> Reading | None:
        """What the screen showed at the last look since the source last spoke."""
        return self._screen

    @property
    def drawn_for(self) -> float | None:
        """Seconds the prompt for a person has been on screen (None: not seen there)."""
        if not self.screen_needs_person:
            return None
        return time.monotonic() - self._drawn_at

    @property
    def screen_needs_person(self) -> bool:
        """The last look saw a prompt for a person (a permission prompt or another dialog)."""
        return self._screen is not None and self._screen.needs_person

    @property
    def prompt_up(self) -> bool:
        """A prompt for a person is on screen, or announced by the CLI's source (`waiting`),
        and the CLI runs to take its answer (what an exited CLI left on screen asks nothing)."""
        running = self._process is ProcState.RUNNING
        return running and (self.screen_needs_person or self.state == "waiting")

    @property
    def process(self) -> ProcState:
        """The supervisor's state of the CLI process, as last told."""
        return self._process

    @property
    def since_monotonic(self) -> float:
        return self._since_mono

    @property
    def session_id(self) -> str | None:
        """Claude Code's conversation (the CLI's hooks and its launch tell it)."""
        return self._session_id

    @session_id.setter
    def session_id(self, value: str | None) -> None:
        self._session_id = value
        self._status = self._make_status()

    def _make_status(self) -> AgentStatus:
        screen = self._screen
        choices = screen.choices if screen and screen.needs_person else ()
        return AgentStatus(
            self._state,
            self._since,
            self._reason,
            self.source,
            self._session_id,
            choices if self._state == "waiting" else (),
        )

    def status(self) -> AgentStatus:
        """The state as it is now: made when it changes, so reading it costs nothing."""
        return self._status

    @property
    def totals(self) -> Mapping[str, float]:
        """Seconds in each state before the current one began (see `seconds_in_states`)."""
        return self._totals

    async def wait_change(self, timeout: float) -> bool:
        """Wait until the state or reason changes; False on timeout."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            return False
        return True


def seconds_in_states(
    totals: Mapping[str, float], state: AgentStateName, since: float, now: float
) -> dict[str, float]:
    """Seconds spent in each state since the sidecar started, the current one (`state`, begun
    at `since`) included up to `now` (both time.monotonic())."""
    seconds: dict[str, float] = dict(totals)
    seconds[state] += now - since
    return seconds
