"""The audit trail on disk: records appended to `audit.jsonl` in batches, each batch written and
fsync'd in a worker thread (group commit: records that come while one batch is written go in the
next), rotated by size. `synced()` is the acknowledgement: it returns once every record written
before it is on disk, so a caller that acts only after it (a decision reaching the CLI, an API
answer) never acts on a record a crash could lose.

A disk that refuses a write (full, read-only, gone) never stops the sidecar: the records are
held in memory (bounded: past it the oldest go, and an `audit-dropped` record counts them), the
problem is told once, and the write is tried again every few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from collections.abc import Callable
from pathlib import Path

import msgspec

from sidecar.audit.records import AuditDroppedRecord, Record
from sidecar.core.masks import scrub

log = logging.getLogger(__name__)

NAME = "audit.jsonl"
MAX_BYTES = 16 * 1024 * 1024  # a file is rotated once it is this big
KEEP = 4  # rotated files kept: audit.jsonl.1 (newest) .. audit.jsonl.4
MAX_HELD = 4 * 1024 * 1024  # bytes of records held in memory while the disk refuses them
RETRY = 5.0  # seconds between tries while it does
# A record nobody waits for (an egress connection's) goes to disk with the next batch anyway,
# at the latest this many seconds later: at 50 connections a second, a batch a few times a
# second rather than an fsync each.
LAZY = 0.25
_TAIL = 64 * 1024  # bytes read back from the end of the file for the last `seq`

_encode = msgspec.json.Encoder().encode


class _Seq(msgspec.Struct):
    seq: int = 0


_decode_seq = msgspec.json.Decoder(_Seq).decode


def files(directory: Path) -> list[Path]:
    """The trail's files, oldest first."""
    return [directory / f"{NAME}.{n}" for n in range(KEEP, 0, -1)] + [directory / NAME]


def _last_seq(path: Path) -> int:
    """The `seq` of the last whole record in `path` (0: none)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - _TAIL))
            tail = fh.read()
    except OSError:
        return 0
    for line in reversed(tail.split(b"\n")):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            return _decode_seq(line).seq
    return 0


class AuditTrail:
    """`on_problem(text)`: the disk refused a write (text) or takes them again (None)."""

    def __init__(
        self,
        directory: Path,
        sleeve: str,
        *,
        max_bytes: int = MAX_BYTES,
        max_held: int = MAX_HELD,
        retry: float = RETRY,
        on_problem: Callable[[str | None], None] | None = None,
    ) -> None:
        self.directory = directory
        self.path = directory / NAME
        self.sleeve = sleeve
        self.max_bytes = max_bytes
        self.max_held = max_held
        self.retry = retry
        self.on_problem = on_problem
        self.problem: str | None = None
        self.written = 0  # records on disk, for /metrics
        self.dropped = 0  # records lost to a disk that refused them for too long
        self._fd: int | None = None
        self._opened = False
        self._seq = 0  # the last seq given
        self._queue: deque[tuple[int, bytes]] = deque()  # (seq, line) not yet on disk
        self._held = 0  # bytes in the queue
        self._done = 0  # every seq up to this is on disk
        self._dropped_now = 0  # dropped since the last `audit-dropped` record
        self._torn = False  # the queue's head is the rest of a line begun on disk
        self._writing = False  # a batch is in the worker thread (the queue's head is its)
        self._task: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._later: asyncio.TimerHandle | None = None  # the batch for lazy records
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []

    # ---- the caller's side ---------------------------------------------------------------------

    def open(self) -> None:
        """Carry `seq` on from the last record; the file is opened (made) by the first batch,
        and a directory that cannot hold it is a problem like a full disk."""
        self._seq = self._done = max(_last_seq(p) for p in files(self.directory))
        self._opened = True

    def _open_file(self) -> int:
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            # A crash mid-write may have left half a line: the next record starts a line of its
            # own (a reader skips the broken one).
            os.write(fd, b"\n")
        return fd

    def write(self, record: Record, *, lazy: bool = False) -> None:
        """Append `record` (given its `seq`, `time` and `sleeve` here); it reaches the disk with
        the next batch — `lazy`: within LAZY seconds, unless something waits sooner."""
        self._seq += 1
        record.seq = self._seq
        record.sleeve = self.sleeve
        line = scrub(_encode(record)) + b"\n"
        self._queue.append((self._seq, line))
        self._held += len(line)
        if self.problem is not None and not self._writing:  # never under a batch in flight
            self._bound()
        if not lazy:
            self._kick()
        elif self._later is None and self._opened:
            self._later = asyncio.get_running_loop().call_later(LAZY, self._kick)

    async def synced(self) -> bool:
        """Wait until every record written so far is on disk (True); False at once while the
        disk refuses them (they are held in memory)."""
        target = self._seq
        if self._done >= target:
            return True
        if self.problem is not None or not self._opened:
            return False
        self._kick()  # lazy records waiting: now
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, future))
        return await future

    async def close(self) -> None:
        """Write what is queued (one try), then close the file."""
        for timer in (self._retry, self._later):
            if timer is not None:
                timer.cancel()
        self._retry = self._later = None
        if self._task is not None:
            await self._task
        if self._queue and self._opened and self.problem is None:
            await self._flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._wake(False)

    @property
    def held(self) -> list[bytes]:
        """Records not on disk yet (in order): a reader adds them after the files."""
        return [line for _, line in self._queue]

    # ---- batches -------------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._task is None and self._retry is None and self._opened:
            self._task = asyncio.get_running_loop().create_task(self._flush(), name="audit")
            self._task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._task = None
        if self._queue and self.problem is None:
            self._kick()  # what came while the batch was written

    async def _flush(self) -> None:
        count = len(self._queue)
        data = b"".join(line for _, line in list(self._queue)[:count])
        self._writing = True
        try:
            written, error = await asyncio.to_thread(self._write, data)
        finally:
            self._writing = False
        self._consume(written)
        if error is None:
            self._recovered()
            self._wake(True)
            return
        problem = (
            f"the audit trail cannot be written in {self.directory} ({error.strerror or error}); "
            f"{len(self._queue)} records are held in memory (at most {self.max_held // 1024} "
            "KiB) until it can"
        )
        if self.problem is None:
            log.warning("%s", problem)
            if self.on_problem is not None:
                self.on_problem(problem)
        self.problem = problem
        self._bound()
        self._wake(False)
        self._retry = asyncio.get_running_loop().call_later(self.retry, self._again)

    def _again(self) -> None:
        self._retry = None
        self._kick()

    def _write(self, data: bytes) -> tuple[int, OSError | None]:
        """In the worker thread: write, fsync, rotate. (bytes written, the error that stopped
        it)."""
        view, done = memoryview(data), 0
        try:
            if self._fd is None:
                self._fd = self._open_file()
            while done < len(data):
                done += os.write(self._fd, view[done:])
            os.fsync(self._fd)
        except OSError as exc:
            return done, exc
        if os.fstat(self._fd).st_size >= self.max_bytes:
            try:
                self._rotate()
            except OSError as exc:  # the records are safe; the file only grows on
                log.warning("audit trail: cannot rotate %s: %s", self.path, exc)
        return done, None

    def _rotate(self) -> None:
        assert self._fd is not None
        for older, newer in zip(files(self.directory), files(self.directory)[1:], strict=False):
            with contextlib.suppress(FileNotFoundError):
                os.replace(newer, older)
        os.close(self._fd)
        self._fd = None
        self._fd = self._open_file()
        dir_fd = os.open(self.directory, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _consume(self, written: int) -> None:
        """Take the records `written` bytes cover off the queue; a line written in part keeps
        its rest at the head (finished by the next write, so the file never holds a torn line
        followed by another)."""
        while written and self._queue:
            seq, line = self._queue[0]
            if written >= len(line):
                self._queue.popleft()
                written -= len(line)
                self._held -= len(line)
                self._done = seq
                self._torn = False
                self.written += 1
            else:
                self._queue[0] = (seq, line[written:])
                self._held -= written
                self._torn = True
                written = 0
        if not self._queue:
            self._done = self._seq

    def _bound(self) -> None:
        """Past `max_held`, the oldest held records go (never a line begun on disk)."""
        while self._held > self.max_held and len(self._queue) > 1:
            at = 1 if self._torn else 0
            _, line = self._queue[at]
            del self._queue[at]
            self._held -= len(line)
            self.dropped += 1
            self._dropped_now += 1

    def _recovered(self) -> None:
        if self.problem is None:
            return
        self.problem = None
        log.warning("the audit trail is written again in %s", self.directory)
        if self._dropped_now:
            count, self._dropped_now = self._dropped_now, 0
            self.write(AuditDroppedRecord(count=count, reason="the disk refused writes"))
        if self.on_problem is not None:
            self.on_problem(None)

    def _wake(self, ok: bool) -> None:
        keep = []
        for target, future in self._waiters:
            if future.done():
                continue
            if self._done >= target:
                future.set_result(True)
            elif not ok:
                future.set_result(False)
            else:
                keep.append((target, future))
        self._waiters = keep
