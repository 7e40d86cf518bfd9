"""One recording being written: the CLI pane's bytes as `"o"` events (secrets redacted, UTF-8
decoded across chunk boundaries, invalid bytes as U+FFFD), markers as `"m"` events, a whole
screen as one redraw; cut with a marker when it would pass the directory's size cap.
"""

from __future__ import annotations

import asyncio
import codecs
import logging
import time
from collections.abc import Iterable

from sidecar.core.text import one_line
from sidecar.record import asciicast
from sidecar.record.redact import Redactor
from sidecar.record.spool import Spool
from sidecar.record.store import Live, RecordStore

log = logging.getLogger(__name__)

RESERVE = 4096  # bytes kept free under the cap for the markers that end a recording
TERM = "tmux-256color"


class Recording:
    """Use `start` (a new CLI run) or `resume` (a supervisor taking over a run after a crash)."""

    def __init__(
        self,
        store: RecordStore,
        rec_id: str,
        fd: int,
        *,
        timestamp: int,
        size: int,
        markers: int,
        secrets: Iterable[str],
    ) -> None:
        self.store = store
        self.id = rec_id
        self.bytes = size
        self.markers = markers
        self.cut = False  # over the cap: nothing more is written
        self.ended = False
        # Event times count from the header's `timestamp`, on the monotonic clock from here.
        self._t0 = time.monotonic() - (time.time() - timestamp)
        self._last = 0.0
        self._redact = Redactor(secrets)
        self._decode = codecs.getincrementaldecoder("utf-8")("replace")
        self._spool = Spool(fd, str(store.path(rec_id)), size)
        store.count_others(rec_id)

    @classmethod
    def start(
        cls,
        store: RecordStore,
        *,
        cli: str,
        sleeve: str,
        size: tuple[int, int],
        secrets: Iterable[str],
    ) -> Recording:
        """A new file for a new CLI run on a terminal of `size` (columns, rows). Raises OSError
        (the directory or the disk refuses)."""
        now = time.time()
        rec_id = store.new_id(now)
        header = asciicast.Header(
            width=size[0],
            height=size[1],
            timestamp=int(now),
            title=f"{sleeve}: {cli}",
            env={"TERM": TERM},
            sleeve={"id": sleeve, "cli": cli},
        )
        fd = store.create(rec_id)
        line = asciicast.header_line(header)
        recording = cls(
            store, rec_id, fd, timestamp=header.timestamp, size=0, markers=0, secrets=secrets
        )
        recording._put(line)
        return recording

    @classmethod
    def resume(cls, store: RecordStore, rec_id: str, secrets: Iterable[str]) -> Recording:
        """The recording of a run a dead supervisor was writing. Raises OSError or ValueError."""
        fd, header, size = store.reopen(rec_id)
        markers = asciicast.count_markers(fd)
        return cls(
            store, rec_id, fd, timestamp=header.timestamp, size=size, markers=markers,
            secrets=secrets,
        )  # fmt: skip

    # ---- what goes in ----------------------------------------------------------------------

    def output(self, data: bytes) -> None:
        """What the pane wrote (called in the control client's read loop: never waits)."""
        if self.cut or self.ended:
            return
        text = self._decode.decode(self._redact.feed(data))
        if text:
            self._put(asciicast.event_line(self._now(), asciicast.OUTPUT, text))

    def frame(self, lines: list[str], row: int, col: int) -> None:
        """The whole screen as it is now (after an attach: what came before is not known)."""
        if self.cut or self.ended:
            return
        text = self._redact.text(asciicast.frame(lines, row, col))
        self._put(asciicast.event_line(self._now(), asciicast.OUTPUT, text))

    def marker(self, label: str) -> None:
        if self.cut or self.ended:
            return
        self._mark(label)

    def resize(self, cols: int, rows: int) -> None:
        """The screen is `cols` x `rows` from here on (`PUT /screen/size`)."""
        if self.cut or self.ended:
            return
        self._put(asciicast.event_line(self._now(), asciicast.RESIZE, f"{cols}x{rows}"))

    def end(self, label: str | None = None) -> None:
        """The run ended: what is held back, then `label`; the file is closed once written."""
        if self.ended:
            return
        if not self.cut:
            rest = self._decode.decode(self._redact.flush(), final=True)
            if rest:
                self._put(asciicast.event_line(self._now(), asciicast.OUTPUT, rest))
            if label:
                self._mark(label)
        self.ended = True
        self._spool.close()

    @property
    def done(self) -> bool:
        """Ended, and its file written and closed."""
        return self.ended and self._spool.done

    async def closed(self, timeout: float) -> bool:
        """Wait until the file is written and closed (shutdown: nothing is left behind)."""
        return await asyncio.to_thread(self._spool.join, timeout)

    # ---- state -------------------------------------------------------------------------------

    @property
    def failed(self) -> str | None:
        """Why the disk stopped taking this recording (None: it takes it)."""
        return self._spool.failed

    def live(self) -> Live:
        return Live(self.id, self.bytes, self.markers)

    def _now(self) -> float:
        self._last = max(self._last, time.monotonic() - self._t0)
        return self._last

    def _mark(self, label: str) -> None:
        text = self._redact.text(one_line(label))
        if self._put(asciicast.event_line(self._now(), asciicast.MARKER, text), reserve=0):
            self.markers += 1

    def _put(self, line: bytes, reserve: int = RESERVE) -> bool:
        size = self.bytes + len(line)
        if not self.store.room(self.id, size + reserve):
            if reserve:
                self._cut()
            return False
        if self._spool.put(line):
            self.bytes = size
            return True
        return False

    def _cut(self) -> None:
        mib = self.store.max_bytes / (1024 * 1024)
        log.warning("recording %s cut: the recordings reached their cap of %g MiB", self.id, mib)
        self._mark(f"recording cut: SIDECAR_RECORD_MAX_MB ({mib:g} MiB) reached")
        self.cut = True
