"""The flight recorder, wired in: a recording per CLI run, started when the CLI runs and ended
when it stops, fed by the tmux control client's tap on the CLI's pane and marked with the events
of the bus. A supervisor that takes over a running CLI after a crash goes on with that run's
recording (`agent.json` names it). A directory or disk that refuses costs the recording, with
one warning, never the CLI.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from sidecar.agent.statefile import AgentFiles
from sidecar.config import Config
from sidecar.core.event_shapes import Event, ScreenResized
from sidecar.core.events import EventBus
from sidecar.core.states import ProcState
from sidecar.pane.control import PaneActivity
from sidecar.pane.protocol import ControlError
from sidecar.pane.screen import Screen, look_styled
from sidecar.record import markers
from sidecar.record.recording import Recording
from sidecar.record.store import Item, Live, RecordStore

log = logging.getLogger(__name__)

CLOSE_WITHIN = 5.0  # seconds shutdown waits for a recording's last bytes to be written


class Recorder:
    """`secrets` gives the values no recording may hold (read at each run's start: the hook
    and telemetry secrets are new for each launch)."""

    def __init__(
        self,
        config: Config,
        bus: EventBus,
        activity: PaneActivity,
        files: AgentFiles,
        secrets: Callable[[], Iterable[str]],
        *,
        size: Callable[[], tuple[int, int]],
    ) -> None:
        self.on = config.recording.on
        self.size = size  # the CLI's screen now: columns, rows
        self.sleeve = config.sleeve_name
        self.store = RecordStore(config.record_dir, config.recording.max_bytes)
        self.activity = activity
        self.files = files
        self.secrets = secrets
        self.current: Recording | None = None
        self._closing: list[Recording] = []
        self._problem: str | None = None  # why recordings are not written (warned once)
        self._looks: set[asyncio.Task[None]] = set()
        if self.on:
            bus.listen(self._event)

    # ---- runs ----------------------------------------------------------------------------

    def process_changed(self, state: ProcState, cli: str | None, *, adopted: bool) -> None:
        """A CLI run begins when its process runs (a new one, or one `adopted` after a crash)
        and ends when it stops; the end waits for the events published with the change."""
        if not self.on:
            return
        if state is ProcState.RUNNING and cli is not None:
            if self.current is None:
                self._begin(cli, adopted=adopted)
        elif self.current is not None:
            asyncio.get_running_loop().call_soon(self._end, self.current)

    def _begin(self, cli: str, *, adopted: bool) -> None:
        previous = self.files.record.recording if adopted else None
        try:
            self.store.prepare()
            if previous is not None:
                recording = Recording.resume(self.store, previous, self.secrets())
                recording.marker("the sidecar's supervisor restarted; this run goes on")
            else:
                recording = Recording.start(
                    self.store,
                    cli=cli,
                    sleeve=self.sleeve,
                    size=self.size(),
                    secrets=self.secrets(),
                )
        except (OSError, ValueError) as exc:
            self._warn(f"not recording {cli}: {exc}")
            self.files.update(recording=None)
            return
        self.current = recording
        self.files.update(recording=recording.id)
        self.activity.tap(self)
        self.attached()  # the screen as it is now: what the pane showed before the tap

    def _end(self, recording: Recording) -> None:
        if self.current is not recording:
            return
        self.current = None
        self.activity.tap(None)
        recording.end()
        if self._problem is not None and recording.failed is None:
            # A whole run recorded: the next refusal is news again.
            log.info("recording works again (%s)", recording.id)
            self._problem = None
        self._closing = [r for r in self._closing if not r.done]
        self._closing.append(recording)
        self.files.update(recording=None)

    # ---- what goes in ----------------------------------------------------------------------

    def wrote(self, data: bytes) -> None:
        """The CLI's pane wrote (the control client's tap: returns at once)."""
        recording = self.current
        if recording is None:
            return
        recording.output(data)
        if recording.failed is not None:
            self._stop(recording, recording.failed)
        elif recording.cut:
            self.activity.tap(None)  # nothing more goes in: the pane needs no decoding

    def skipped(self, screen: Screen | None, *, first: bool) -> None:
        """The pane wrote too fast to be tapped byte for byte: a frame of it instead."""
        recording = self.current
        if recording is None:
            return
        if first:
            recording.marker("output too fast to record byte for byte: a frame a second")
        if screen is not None:
            recording.frame(list(screen.lines), screen.cursor_row, screen.cursor_col)

    def _event(self, event: Event) -> None:
        recording = self.current
        if recording is not None and isinstance(event, ScreenResized):
            recording.resize(event.cols, event.rows)
        label = markers.label(event)
        if recording is not None and label is not None:
            recording.marker(label)

    def attached(self) -> None:
        """The control client (re)attached: the screen, as a frame, begins what follows."""
        if self.current is not None:
            look = asyncio.create_task(self._frame(self.current), name="recording-frame")
            self._looks.add(look)
            look.add_done_callback(self._looks.discard)

    async def _frame(self, recording: Recording) -> None:
        try:
            screen = await look_styled(self.activity.ask)
        except ControlError as exc:
            log.debug("recording %s: no frame of the screen: %s", recording.id, exc)
            return
        recording.frame(list(screen.lines), screen.cursor_row, screen.cursor_col)

    def _stop(self, recording: Recording, why: str) -> None:
        """The disk refused: this run goes unrecorded from here on; the CLI is not bothered."""
        self._warn(f"recording {recording.id} stopped: {why}")
        self._end(recording)

    def _warn(self, problem: str) -> None:
        if self._problem is None:
            log.warning("%s (the CLI runs on; not said again until a recording works)", problem)
        self._problem = problem

    # ---- what the API reads --------------------------------------------------------------

    @property
    def warnings(self) -> list[str]:
        return [self._problem] if self._problem is not None else []

    def live(self) -> Live | None:
        return self.current.live() if self.current is not None else None

    async def items(self) -> list[Item]:
        """Every recording, oldest first (read in a worker thread)."""
        return await asyncio.to_thread(self.store.items, self.live())

    async def stop(self) -> None:
        """Shutdown: the run's recording ends and every file is written and closed."""
        if self.current is not None:
            self._end(self.current)
        for look in list(self._looks):
            look.cancel()
        for recording in self._closing:
            if not await recording.closed(CLOSE_WITHIN):
                log.warning("recording %s: its last bytes were not written in time", recording.id)
        self._closing = []
