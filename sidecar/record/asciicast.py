"""asciicast v2, the format of asciinema 2.x (`asciinema play`, `asciinema cat`, the web player):
a JSON header line, then one event per line, `[seconds, code, data]`: `"o"` what the terminal
printed, `"m"` a marker, `"r"` a resize. Writing it, and what a listing reads back: the header,
the time of the last event, the markers.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import msgspec

VERSION = 2
OUTPUT, MARKER, RESIZE = "o", "m", "r"
# A marker line holds this and an output line never does: a `"` inside an output event's
# string is escaped (`\"`), so `,"m",` can only be a marker's code.
MARKER_BYTES = b',"m",'
MAX_HEADER = 4096
TAIL = 64 * 1024  # bytes read from a file's end for its last event

_encode = msgspec.json.Encoder().encode


class Header(msgspec.Struct, kw_only=True):
    """The first line. `sleeve` is ours (asciinema and the web player ignore keys they do not
    know): the sleeve and the CLI the run was of."""

    version: int = VERSION
    width: int
    height: int
    timestamp: int  # seconds since the epoch; every event's time counts from it
    title: str = ""
    env: dict[str, str] = msgspec.field(default_factory=dict)
    sleeve: dict[str, str] = msgspec.field(default_factory=dict)


def header_line(header: Header) -> bytes:
    return _encode(header) + b"\n"


def event_line(seconds: float, code: str, data: str) -> bytes:
    return _encode((round(seconds, 6), code, data)) + b"\n"


def frame(lines: list[str], row: int, col: int) -> str:
    """What redraws a whole screen: home, clear, each line (its SGR escapes kept, attributes
    reset at its start), then the cursor where it was (`row`, `col`: 0-based)."""
    body = "\r\n".join(f"\x1b[0m{line}" for line in lines)
    return f"\x1b[0m\x1b[H\x1b[2J{body}\x1b[0m\x1b[{row + 1};{col + 1}H"


def read_header(data: bytes) -> Header | None:
    """The header at the start of `data` (a file's first bytes); None if there is none."""
    line, sep, _ = data.partition(b"\n")
    if not sep:
        return None
    try:
        header = msgspec.json.decode(line, type=Header)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return header if header.version == VERSION else None


def last_time(tail: bytes) -> float | None:
    """The time of the last complete event in `tail` (a file's last bytes)."""
    lines = tail.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line cut short
    for line in reversed(lines):
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            event: Any = msgspec.json.decode(line, type=tuple[float, str, str])
            return float(event[0])
    return None


def count_markers(fd: int) -> int:
    """The `"m"` events of an open file, read from its start in big blocks."""
    found = 0
    carry = b""
    offset = 0
    while block := os.pread(fd, 1 << 20, offset):
        offset += len(block)
        data = carry + block
        found += data.count(MARKER_BYTES)
        carry = data[-(len(MARKER_BYTES) - 1) :]
    return found
