"""A recording's writes, made by a thread of its own: the event loop that reads tmux's control
client only appends bytes here and never waits for a disk. Each `put` is whole lines, written
with no other write between them: the bytes a `write` call handed to the kernel stay in the page
cache when the process dies, so a crash leaves every event but at most the last one whole (a
process killed during a write of several pages may leave that one cut: whoever reads the file
stops at its last newline, `store.reopen` removes the rest).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque

from sidecar.core.files import write_all

BEHIND = 8 * 1024 * 1024  # bytes waiting for the disk past which more are dropped


class Spool:
    def __init__(self, fd: int, path: str, size: int) -> None:
        """`fd`: the file, opened for appending; `size`: its size now."""
        self._fd = fd
        self._path = path
        self._size = size
        self._queue: deque[bytes | None] = deque()
        self._pending = 0
        self._wake = threading.Condition()
        self.failed: str | None = None  # why writing stopped (the disk refused)
        self.dropped = 0  # bytes dropped because the disk fell behind
        self._thread = threading.Thread(target=self._run, name="recording", daemon=True)
        self._thread.start()

    def put(self, data: bytes) -> bool:
        """Queue `data` (whole lines) for the file; False when dropped (the disk is behind, or
        it refused an earlier write)."""
        if self.failed is not None:
            return False
        with self._wake:
            if self._pending + len(data) > BEHIND:
                self.dropped += len(data)
                return False
            self._pending += len(data)
            self._queue.append(data)
            self._wake.notify()
        return True

    def close(self) -> None:
        """Write what is queued, then close the file (in the thread: this returns at once)."""
        with self._wake:
            self._queue.append(None)
            self._wake.notify()

    @property
    def done(self) -> bool:
        """The file is written and closed."""
        return not self._thread.is_alive()

    def join(self, timeout: float) -> bool:
        """Wait until the file is closed; whether it is."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                data = self._queue.popleft()
                if data is not None:
                    self._pending -= len(data)
            if data is None:
                os.close(self._fd)
                return
            if self.failed is None:
                self._write(data)

    def _write(self, data: bytes) -> None:
        end = self._size
        try:
            write_all(self._fd, data)
            self._size += len(data)
        except OSError as exc:
            # A short write (a full disk) leaves part of a line: cut the file back to its last
            # whole line, so that it stays valid.
            self.failed = exc.strerror or str(exc)
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, end)
