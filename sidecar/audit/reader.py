"""Reading the audit trail back (`GET /audit`, `sidecar audit`, `sidecar policy test`): the files
oldest first, then the records still held in memory, filtered by time, type and `seq`, as the raw
lines they were written as (nothing is decoded whole or encoded again). Blocking: run it in a
worker thread.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from sidecar.audit.trail import files

MAX_LIMIT = 10_000
DEFAULT_LIMIT = 100


class _Head(msgspec.Struct):
    type: str = ""
    seq: int = 0
    time: str = ""


_decode_head = msgspec.json.Decoder(_Head).decode


@dataclass(frozen=True)
class Query:
    since: str | None = None  # a time in the trail's own format (RFC 3339 UTC, ms, Z)
    types: frozenset[str] | None = None
    after: int | None = None  # `seq`: the first `limit` records after it (paging forward)
    limit: int = DEFAULT_LIMIT


def _lines(directory: Path, held: Iterable[bytes]) -> Iterator[bytes]:
    for path in files(directory):
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
            yield from fh
    yield from held


def read(directory: Path, held: list[bytes], query: Query) -> tuple[list[bytes], bool]:
    """The records matching `query` as JSON lines (no newline), oldest first, and whether more
    matched than `limit` (without `after`: the latest `limit` are given)."""
    kept: deque[bytes] = deque(maxlen=None if query.after is not None else query.limit)
    seen = 0
    last = 0  # records held in memory may be on disk too by now: each `seq` once
    for raw in _lines(directory, held):
        line = raw.rstrip(b"\n")
        try:
            head = _decode_head(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue  # a line torn by a crash
        if head.seq and head.seq <= last:
            continue
        last = max(last, head.seq)
        if query.types is not None and head.type not in query.types:
            continue
        if query.since is not None and head.time < query.since:
            continue
        if query.after is not None and head.seq <= query.after:
            continue
        seen += 1
        if query.after is not None and len(kept) >= query.limit:
            continue
        kept.append(line)
    return list(kept), seen > len(kept)
