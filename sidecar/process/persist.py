"""The supervisor's state in one small file in the state dir (`Layout.supervisor_state`), so
that a supervisor started again after a crash can adopt what runs (see `sidecar.process.adopt`)
instead of starting it anew.

One typed record (`SupervisorState`), written atomically (temp file + rename, 0600) whenever it
changes and never on a timer, and read back whole or not at all: a missing, truncated or
corrupt file, one of another version, or one with an unknown or mistyped field is no state.
No fsync: the file lives in the runtime state dir and describes processes; a process crash
keeps the page cache, and a machine crash takes the processes with it.

To extend it, add a field with a default to `SupervisorState`: files written before still read
(a field removed or retyped wants `VERSION` bumped).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path

import msgspec

from sidecar.core.files import write_new
from sidecar.core.proc import cmdline, start_time

log = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 64 * 1024  # a larger file is not ours


class ProcRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One process, by pid and start time (`sidecar.core.proc.start_time`): a reused pid is
    another."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int | None) -> ProcRef | None:
        started = start_time(pid) if pid else None
        return None if pid is None or started is None else cls(pid, started)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


class SupervisorState(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a supervisor needs to take over from a dead one (and what /status reports)."""

    version: int = VERSION
    init: ProcRef  # the init process this sidecar runs under: a file from another run names another
    cli: str  # the CLI's registry name (a resleeve's target once it is being started)
    cli_state: str  # sidecar.core.states.ProcState value
    # The registry's argv the launch started from (its command or resume argv), and the argv
    # the pane was started with: that one with our hook settings, session arguments and the
    # egress guard added.
    command: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    resume: bool = False  # whether that argv was the resume argv
    pane_command: str = ""  # digest of the pane process's argv (`digest`): it names the CLI
    tmux: ProcRef | None = None  # the tmux server
    pane: ProcRef | None = None  # the pane's process (the waiter around the CLI)
    cli_pid: ProcRef | None = None  # the CLI process
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None  # time.monotonic() when the CLI started (one clock per boot)
    backoff_n: int = 0  # the restart policy's failures in a row
    restart_due: float | None = None  # time.monotonic() when a restart in backoff is due
    resleeve_to: str | None = None  # a resleeve under way: the CLI it goes to
    resleeve_from: str | None = None
    stopping: bool = False  # a shutdown is under way
    ttyd: ProcRef | None = None
    warnings: tuple[str, ...] = ()
    egress_port: int | None = None  # the egress proxy's: the CLI's environment names it


def digest(argv: Sequence[str]) -> str:
    """A short fingerprint of an argv (the pane's argv carries the CLI's env: never stored)."""
    return hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def cmdline_digest(pid: int) -> str | None:
    """`digest` of the argv `pid` runs now, None when it is gone."""
    argv = cmdline(pid)
    return None if argv is None else digest([a.decode("utf-8", "surrogateescape") for a in argv])


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SupervisorState)


def encode(state: SupervisorState) -> bytes:
    return _encoder.encode(state) + b"\n"


def decode(raw: bytes) -> SupervisorState:
    """The record in `raw`; ValueError saying why it is not one (a missing, unknown or
    mistyped field, bad JSON, another version)."""
    try:
        state = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        msg = f"not a state record ({exc})"
        raise ValueError(msg) from None
    if state.version != VERSION:
        msg = f"of version {state.version}, not {VERSION}"
        raise ValueError(msg)
    return state


def load(path: Path) -> tuple[SupervisorState | None, str]:
    """The record in `path`, or None and why there is none."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, "no state file"
    except OSError as exc:
        return None, f"state file unreadable: {exc.strerror}"
    if len(raw) > MAX_BYTES:
        return None, "state file too large"
    try:
        return decode(raw), "state file read"
    except ValueError as exc:
        return None, f"state file {exc}"


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` (0600): a reader sees the old file or the new, never a part."""
    write_new(path, data, 0o600)


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class StateFile:
    """The state file at `path`, written when the record changed (never on a timer). A write
    that fails costs only the adoption after a crash (the next supervisor starts afresh)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved = b""

    def save(self, record: SupervisorState) -> None:
        data = encode(record)
        if data == self._saved:
            return
        try:
            write_atomic(self.path, data)
        except OSError as exc:
            log.warning("state file %s not written: %s", self.path, exc)
            return
        self._saved = data

    def remove(self) -> None:
        remove(self.path)
