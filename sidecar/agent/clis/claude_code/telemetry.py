"""Claude Code's usage (2.1.330): its own OpenTelemetry export, turned on for the sidecar. With
`CLAUDE_CODE_ENABLE_TELEMETRY=1` and an OTLP logs exporter it POSTs OTLP/HTTP JSON logs; every
model request is a log record `api_request` carrying the numbers the API returned (`model`,
`input_tokens`, `output_tokens`, `cache_read_tokens`, `cache_creation_tokens`) and the cost it
computed itself (`cost_usd`). Only its logs are pointed at the sidecar, through the logs-only
variables: its metrics and traces go where the user's own variables send them, and the user's
logs destination gets what the sidecar receives (`sidecar.usage.relay`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.usage.reports import UsageReport, count, dollars, model_name
from sidecar.usage.telemetry import (
    SECRET_HEADER,
    Destination,
    Telemetry,
    TelemetryLaunch,
    otlp_logs_destination,
)

ON = ("1", "true", "yes", "on")
EXPORT_EVERY_MS = 1000  # the logs' batch interval (its default is 5 s): the budget acts sooner


def launch(start: TelemetryLaunch) -> Mapping[str, str]:
    exporters = [e.strip() for e in start.env.get("OTEL_LOGS_EXPORTER", "").split(",")]
    exporters = [e for e in exporters if e and e != "none"]
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": ",".join(dict.fromkeys([*exporters, "otlp"])),
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": start.endpoint,
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS": f"{SECRET_HEADER}={start.secret}",
        "OTEL_LOGS_EXPORT_INTERVAL": str(EXPORT_EVERY_MS),
    }


def read(record: Mapping[str, Any]) -> UsageReport | None:
    if record.get("event.name") != "api_request":
        return None
    cost = record.get("cost_usd")
    return UsageReport(
        model=model_name(record.get("model")),
        input=count(record.get("input_tokens", 0), "input_tokens"),
        output=count(record.get("output_tokens", 0), "output_tokens"),
        cache_read=count(record.get("cache_read_tokens", 0), "cache_read_tokens"),
        cache_creation=count(record.get("cache_creation_tokens", 0), "cache_creation_tokens"),
        cost_usd=None if cost is None else dollars(cost, "cost_usd"),
    )


def destination(env: Mapping[str, str]) -> Destination | None:
    """Where the user's own settings send its logs (nowhere unless its telemetry is on)."""
    if env.get("CLAUDE_CODE_ENABLE_TELEMETRY", "").strip().lower() not in ON:
        return None
    return otlp_logs_destination(env)


TELEMETRY = Telemetry(launch, read, destination)
