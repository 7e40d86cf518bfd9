"""Gemini CLI's usage (0.61): its own OpenTelemetry export, turned on for the sidecar by its
`GEMINI_TELEMETRY_*` variables (which win over every settings file). With protocol `http` it
POSTs OTLP/HTTP JSON to `<endpoint>/v1/logs`, `/v1/traces` and `/v1/metrics`; every model
response is a log record `gemini_cli.api_response` with the model and the API's `usageMetadata`.
It computes no cost: the pinned price table prices it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.usage.reports import BadReport, UsageReport, count, model_name
from sidecar.usage.telemetry import (
    SECRET_HEADER,
    Destination,
    Telemetry,
    TelemetryLaunch,
    headers_of,
)

EVENT = "gemini_cli.api_response"
LOGS = "/v1/logs"
ON = ("true", "1")  # what Gemini's own flag parser takes for true
# Its exporters take their URLs from the endpoint, and their headers from the OpenTelemetry
# SDK's variables: a signal's own variable wins, key by key, over the general one's.
HEADER_VARS = tuple(f"OTEL_EXPORTER_OTLP_{s}_HEADERS" for s in ("LOGS", "TRACES", "METRICS"))


def launch(start: TelemetryLaunch) -> Mapping[str, str]:
    secret = f"{SECRET_HEADER}={start.secret}"
    return {
        "GEMINI_TELEMETRY_ENABLED": "true",
        "GEMINI_TELEMETRY_TARGET": "local",  # not Google Cloud
        "GEMINI_TELEMETRY_OTLP_ENDPOINT": start.endpoint.removesuffix(LOGS),
        "GEMINI_TELEMETRY_OTLP_PROTOCOL": "http",  # JSON (its default is gRPC)
        # A settings file's outfile, collector or CLI sign-in would replace the export or hold
        # it back: an empty or false variable wins over each.
        "GEMINI_TELEMETRY_OUTFILE": "",
        "GEMINI_TELEMETRY_USE_COLLECTOR": "false",
        "GEMINI_TELEMETRY_USE_CLI_AUTH": "false",
        **dict.fromkeys(HEADER_VARS, secret),
    }


def read(record: Mapping[str, Any]) -> UsageReport | None:
    """Gemini's prompt count includes the cached tokens (counted as a cache read here) and
    leaves out the tool-use prompt's; thoughts are billed as output. The four counts add up to
    its `total_token_count`."""
    if record.get("event.name") != EVENT:
        return None
    prompt = count(record.get("input_token_count", 0), "input_token_count")
    cached = count(record.get("cached_content_token_count", 0), "cached_content_token_count")
    if cached > prompt:
        msg = f"cached_content_token_count {cached} is more than input_token_count {prompt}"
        raise BadReport(msg)
    tool = count(record.get("tool_token_count", 0), "tool_token_count")
    output = count(record.get("output_token_count", 0), "output_token_count")
    thoughts = count(record.get("thoughts_token_count", 0), "thoughts_token_count")
    return UsageReport(
        model=model_name(record.get("model")),
        input=count(prompt - cached + tool, "input tokens"),
        output=count(output + thoughts, "output tokens"),
        cache_read=cached,
        cache_creation=0,
        cost_usd=None,
    )


def destination(env: Mapping[str, str]) -> Destination | None:
    """Where the user's own variables send its logs: telemetry on, the local target, protocol
    http, an endpoint. Set in a settings file instead, it is not relayed."""
    if env.get("GEMINI_TELEMETRY_ENABLED", "") not in ON:
        return None
    if env.get("GEMINI_TELEMETRY_TARGET", "local") != "local":
        return None
    if env.get("GEMINI_TELEMETRY_OTLP_PROTOCOL") != "http":
        return None
    # Gemini takes its own variable when it is set at all, even empty (JavaScript's `??`).
    base = env.get("GEMINI_TELEMETRY_OTLP_ENDPOINT", env.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))
    base = base.strip().strip("'\"")
    if not base.startswith(("http://", "https://")) or env.get("GEMINI_TELEMETRY_OUTFILE"):
        return None
    raw = env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    headers = {**headers_of(raw), **headers_of(env.get("OTEL_EXPORTER_OTLP_LOGS_HEADERS", ""))}
    return Destination(base.rstrip("/") + LOGS, headers)


TELEMETRY = Telemetry(launch, read, destination)
