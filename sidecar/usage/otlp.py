"""OTLP/HTTP logs in JSON (the OpenTelemetry protocol's `ExportLogsServiceRequest`), the part the
sidecar reads: every log record's attributes as plain values; traces and metrics only checked for
their shape (the sidecar drops them). A body that is not that shape is refused whole (the caller
answers 400)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import msgspec


class BadBody(ValueError):
    """Not an OTLP/HTTP JSON logs request; the message says where."""


MAX_RECORDS = 10_000  # log records in one request (the CLI's batches hold a few hundred)


def _value(value: Any) -> Any:
    """An `AnyValue` as a plain value (`intValue` may come as a string: int64 in JSON)."""
    if not isinstance(value, dict) or len(value) != 1:
        return None
    kind, inner = next(iter(value.items()))
    if kind in ("stringValue", "boolValue", "doubleValue", "intValue"):
        return inner
    return None  # arrays, maps, bytes: nothing the usage needs


def attributes(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        return {}
    return {
        item["key"]: _value(item.get("value"))
        for item in items
        if isinstance(item, dict) and isinstance(item.get("key"), str)
    }


def _list(parent: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = parent.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        msg = f"{where}{key} is not a list of objects"
        raise BadBody(msg)
    return value


# What each signal's export request holds at its top: its resources.
RESOURCES = {"logs": "resourceLogs", "traces": "resourceSpans", "metrics": "resourceMetrics"}


def request(raw: bytes, signal: str) -> dict[str, Any]:
    """The JSON export request of `signal` (a key of RESOURCES). Raises BadBody."""
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        msg = f"not JSON: {exc}"
        raise BadBody(msg) from None
    key = RESOURCES[signal]
    if not isinstance(data, dict) or not isinstance(data.get(key), list):
        msg = f"not an OTLP {signal} request: no {key} list"
        raise BadBody(msg)
    return data


def records(raw: bytes) -> list[dict[str, Any]]:
    """Every log record of the request: its attributes, with `body` its body's string. Raises
    BadBody."""
    data = request(raw, "logs")
    found = list(_walk(data))
    if len(found) > MAX_RECORDS:
        msg = f"more than {MAX_RECORDS} log records in one request"
        raise BadBody(msg)
    return found


def _walk(data: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for i, resource in enumerate(_list(data, "resourceLogs", "")):
        for j, scope in enumerate(_list(resource, "scopeLogs", f"resourceLogs[{i}].")):
            where = f"resourceLogs[{i}].scopeLogs[{j}]."
            for record in _list(scope, "logRecords", where):
                found = attributes(record.get("attributes"))
                found["body"] = _value(record.get("body"))
                yield found
