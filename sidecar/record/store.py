"""The recordings directory: a file per CLI run (`<id>.cast`, 0600, in a 0700 directory), listed
from the files themselves (their header, their last event, their markers: a crash leaves nothing
to reconcile), and kept under its size cap by removing the oldest first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.record import asciicast

log = logging.getLogger(__name__)

SUFFIX = ".cast"
# When it began (UTC, to the microsecond: ids sort oldest first), and a random part.
ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}\.[0-9]{6}Z-[0-9a-f]{6}$")
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC


class NoRecording(LookupError):
    """No recording of that id (404)."""

    def __init__(self, rec_id: str) -> None:
        super().__init__(f"no recording {rec_id!r}")


@dataclass(frozen=True)
class Item:
    id: str
    cli: str
    started: float  # seconds since the epoch
    ended: float | None  # None: still being written
    bytes: int
    markers: int


@dataclass(frozen=True)
class Live:
    """What the recording being written says of itself (its file is not read back)."""

    id: str
    bytes: int
    markers: int


class RecordStore:
    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.dir = directory
        self.max_bytes = max_bytes
        self._others = 0  # bytes of the files but the live one, as last counted
        self._cache: dict[str, tuple[tuple[int, int], Item]] = {}
        self._lock = threading.Lock()  # listings run in worker threads

    def prepare(self) -> None:
        """Make the directory (0700) if it is missing. Raises OSError."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.dir.lstat()
        if not stat.S_ISDIR(info.st_mode):
            msg = f"{self.dir} is not a directory"
            raise NotADirectoryError(msg)

    def path(self, rec_id: str) -> Path:
        """The file of `rec_id`; NoRecording for an id that cannot be one."""
        if not ID_RE.match(rec_id):
            raise NoRecording(rec_id)
        return self.dir / f"{rec_id}{SUFFIX}"

    @staticmethod
    def new_id(now: float) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        return f"{stamp}.{int(now % 1 * 1_000_000):06d}Z-{secrets.token_hex(3)}"

    def create(self, rec_id: str) -> int:
        """A new, empty file for `rec_id`, opened for appending. Raises OSError."""
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _OPEN
        return os.open(self.path(rec_id), flags, 0o600)

    def reopen(self, rec_id: str) -> tuple[int, asciicast.Header, int]:
        """An existing recording opened to go on with (a supervisor taking over its CLI run):
        its fd, header and size, a line cut short at its end removed. Raises OSError, or
        ValueError for a file that is no recording."""
        fd = os.open(self.path(rec_id), os.O_RDWR | os.O_APPEND | _OPEN)
        try:
            info = os.fstat(fd)
            header = asciicast.read_header(os.pread(fd, asciicast.MAX_HEADER, 0))
            if not stat.S_ISREG(info.st_mode) or header is None:
                msg = f"{rec_id} is not an asciicast v2 recording"
                raise ValueError(msg)
            size = info.st_size
            tail = os.pread(fd, min(size, asciicast.TAIL), size - min(size, asciicast.TAIL))
            if not tail.endswith(b"\n"):
                size -= len(tail) - tail.rfind(b"\n") - 1
                os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd, header, size

    # ---- the size cap ----------------------------------------------------------------------

    def files(self) -> list[tuple[str, int]]:
        """(id, size) of every recording, oldest first."""
        found = []
        with contextlib.suppress(OSError), os.scandir(self.dir) as entries:
            for entry in entries:
                rec_id = entry.name.removesuffix(SUFFIX)
                if entry.name.endswith(SUFFIX) and ID_RE.match(rec_id):
                    with contextlib.suppress(OSError):
                        info = entry.stat(follow_symlinks=False)
                        if stat.S_ISREG(info.st_mode):
                            found.append((rec_id, info.st_size))
        return sorted(found)

    def count_others(self, live: str) -> None:
        """Count the bytes of every recording but `live` (at the start of a recording)."""
        self._others = sum(size for rec_id, size in self.files() if rec_id != live)

    def room(self, live: str, live_bytes: int) -> bool:
        """Whether `live_bytes` of the live recording fit under the cap, once the oldest of the
        others are removed to make room (the live one is never removed)."""
        if live_bytes + self._others <= self.max_bytes:
            return True
        for rec_id, size in self.files():
            if live_bytes + self._others <= self.max_bytes:
                break
            if rec_id == live:
                continue
            try:
                os.unlink(self.path(rec_id))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("recording %s not removed to make room: %s", rec_id, exc)
                continue
            log.info("recording %s removed: the recordings are over their size cap", rec_id)
            self._others -= size
        self._others = max(self._others, 0)
        return live_bytes + self._others <= self.max_bytes

    # ---- listing ---------------------------------------------------------------------------

    def items(self, live: Live | None) -> list[Item]:
        """Every recording, oldest first (blocking: it reads files; run it in a thread)."""
        out = []
        for rec_id, _ in self.files():
            item = self._item(rec_id)
            if item is None:
                continue
            if live is not None and rec_id == live.id:
                item = Item(rec_id, item.cli, item.started, None, live.bytes, live.markers)
            out.append(item)
        with self._lock:
            for gone in set(self._cache) - {item.id for item in out}:
                del self._cache[gone]
        return out

    def _item(self, rec_id: str) -> Item | None:
        try:
            fd = os.open(self.path(rec_id), os.O_RDONLY | os.O_NONBLOCK | _OPEN)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            key = (info.st_size, info.st_mtime_ns)
            with self._lock:
                cached = self._cache.get(rec_id)
            if cached is not None and cached[0] == key:
                return cached[1]
            header = asciicast.read_header(os.pread(fd, asciicast.MAX_HEADER, 0))
            if header is None:
                return None
            size = info.st_size
            tail = os.pread(fd, min(size, asciicast.TAIL), size - min(size, asciicast.TAIL))
            last = asciicast.last_time(tail)
            ended = header.timestamp + last if last is not None else float(header.timestamp)
            cli = header.sleeve.get("cli", "")
            item = Item(rec_id, cli, header.timestamp, ended, size, asciicast.count_markers(fd))
        except OSError:
            return None
        finally:
            os.close(fd)
        with self._lock:
            self._cache[rec_id] = (key, item)
        return item
