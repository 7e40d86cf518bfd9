"""`GET /audit`: the audit trail read back, filtered by time, type and `seq`, as the lines were
written (`sidecar.audit.reader` reads them in a worker thread; nothing is encoded again).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from aiohttp import web

from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.audit import reader
from sidecar.audit.records import TYPES, AuditAnswer
from sidecar.audit.trail import AuditTrail

MAX_SEQ = 2**62
PARAMETERS = (
    {
        "name": "since",
        "in": "query",
        "description": "RFC 3339 time: records from then on",
        "schema": {"type": "string", "format": "date-time"},
    },
    {
        "name": "type",
        "in": "query",
        "description": "record types, comma-separated (leave it out for every type)",
        "style": "form",
        "explode": False,
        "schema": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "enum": list(TYPES)},
        },
    },
    {
        "name": "limit",
        "in": "query",
        "description": f"at most this many records (1-{reader.MAX_LIMIT}, default "
        f"{reader.DEFAULT_LIMIT}): the latest, or with `after` the first after it",
        "schema": {"type": "integer", "minimum": 1, "maximum": reader.MAX_LIMIT},
    },
    {
        "name": "after",
        "in": "query",
        "description": "a `seq`: the records after it, oldest first (to page through)",
        "schema": {"type": "integer", "minimum": 0, "maximum": MAX_SEQ},
    },
)


def _since(raw: str) -> str:
    """An RFC 3339 time in the trail's own format (UTC, milliseconds, Z), which compares as
    text."""
    try:
        when = datetime.fromisoformat(raw.strip().upper())
    except ValueError:
        msg = f"since: {raw!r} is not an RFC 3339 time (2025-01-31T12:00:00Z)"
        raise httpio.BadRequest(msg) from None
    if when.tzinfo is None:
        msg = f"since: {raw!r} has no time zone (add Z or an offset)"
        raise httpio.BadRequest(msg)
    text = when.astimezone(UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def _number(raw: str, name: str, low: int, high: int) -> int:
    if not raw.isdigit() or not low <= int(raw) <= high:
        msg = f"{name}: must be a whole number from {low} to {high}, got {raw!r}"
        raise httpio.BadRequest(msg)
    return int(raw)


def query_of(request: web.Request) -> reader.Query:
    q = request.query
    types = None
    if "type" in q:
        types = frozenset(t.strip() for t in q["type"].split(","))
        unknown = sorted(types - set(TYPES))
        if unknown:
            shown = ", ".join(repr(t) for t in unknown)
            msg = f"type: unknown {shown}; one of {', '.join(TYPES)} (comma-separated)"
            raise httpio.BadRequest(msg)
    return reader.Query(
        since=_since(q["since"]) if "since" in q else None,
        types=types,
        after=_number(q["after"], "after", 0, MAX_SEQ) if "after" in q else None,
        limit=_number(q["limit"], "limit", 1, reader.MAX_LIMIT)
        if "limit" in q
        else reader.DEFAULT_LIMIT,
    )


def audit_operation(audit: AuditTrail) -> Operation:
    async def listing(request: web.Request) -> web.Response:
        query = query_of(request)
        held = audit.held
        lines, truncated = await asyncio.to_thread(reader.read, audit.directory, held, query)
        body = b'{"records":[%s],"truncated":%s}' % (
            b",".join(lines),
            b"true" if truncated else b"false",
        )
        return httpio.raw_answer(body)

    return Operation(
        "GET",
        "/audit",
        listing,
        "getAudit",
        "status",
        "The audit trail: approvals, egress connections, list and policy changes, resleeves",
        {200: AuditAnswer},
        description="Records as they were appended to `audit.jsonl` (and its rotated files), "
        "oldest first, with those the disk has not taken yet. Without `after`, the latest "
        "`limit` records matching; with it, the first `limit` after that `seq` (page on with "
        "the last one's). 400: a bad parameter. The view token is enough.",
        errors=(400,),
        parameters=PARAMETERS,
    )
