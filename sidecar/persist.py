"""The supervisor's state in one small file in the state dir, so that a supervisor started again
after a crash can adopt what runs (see `sidecar.adopt`) instead of starting it anew.

One typed record (`SupervisorState`), written atomically (temp file + rename, 0600) whenever it
changes and never on a timer, and read back whole or not at all: a missing, truncated or
corrupt file, one of another version, or one with an unknown or mistyped field is no state.
No fsync: the file lives in the runtime state dir and describes processes; a process crash
keeps the page cache, and a machine crash takes the processes with it.

To extend it, add a field with a default to `SupervisorState`: files written before still read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import types
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from sidecar.proc import start_time

STATE_FILE = "supervisor.json"
VERSION = 1
MAX_BYTES = 64 * 1024  # a larger file is not ours


@dataclass(frozen=True)
class ProcRef:
    """One process, by pid and start time (`sidecar.proc.start_time`): a reused pid is another."""

    pid: int
    start: float

    @classmethod
    def of(cls, pid: int | None) -> ProcRef | None:
        started = start_time(pid) if pid else None
        return None if pid is None or started is None else cls(pid, started)

    def alive(self) -> bool:
        return start_time(self.pid) == self.start


@dataclass(frozen=True)
class SupervisorState:
    """What a supervisor needs to take over from a dead one (and what /status reports)."""

    init: ProcRef  # the init process this sidecar runs under: a file from another run names another
    cli: str  # the CLI's registry name (a resleeve's target once it is being started)
    cli_state: str  # sidecar.states.ProcState value
    argv: tuple[str, ...] = ()  # the argv the pane was started with
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


def digest(argv: Sequence[str]) -> str:
    """A short fingerprint of an argv (the pane's argv carries the CLI's env: never stored)."""
    return hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def cmdline_digest(pid: int) -> str | None:
    """`digest` of the argv `pid` runs now, None when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    return digest([a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]])


def encode(state: SupervisorState) -> bytes:
    return json.dumps({"version": VERSION, **asdict(state)}, sort_keys=True).encode() + b"\n"


class _Bad(Exception):
    """A value that does not have its field's type."""


def _conform(tp: Any, value: Any) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        for arg in get_args(tp):
            with contextlib.suppress(_Bad):
                return _conform(arg, value)
        raise _Bad
    if tp is type(None) and value is None:
        return None
    if origin is tuple and isinstance(value, list):
        return tuple(_conform(get_args(tp)[0], item) for item in value)
    if is_dataclass(tp) and isinstance(tp, type) and isinstance(value, dict):
        return _build(tp, value)
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    raise _Bad


def _build(cls: type[Any], data: dict[str, Any]) -> Any:
    hints = get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    if set(data) - set(known):
        raise _Bad
    values = {}
    for name, field in known.items():
        if name in data:
            values[name] = _conform(hints[name], data[name])
        elif field.default is MISSING:
            raise _Bad
    return cls(**values)


def decode(raw: bytes) -> SupervisorState:
    """The record in `raw`; ValueError saying why it is not one."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        msg = "not JSON (truncated or corrupt)"
        raise ValueError(msg) from None
    if not isinstance(data, dict) or data.pop("version", None) != VERSION:
        msg = f"not a version {VERSION} state record"
        raise ValueError(msg)
    try:
        state: SupervisorState = _build(SupervisorState, data)
    except _Bad:
        msg = "a field is missing, unknown or of the wrong type"
        raise ValueError(msg) from None
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
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover temp file keeps its mode through O_CREAT
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
