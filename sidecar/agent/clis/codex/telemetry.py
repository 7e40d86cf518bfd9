"""Codex CLI's usage (0.169): its own OpenTelemetry export, pointed at the sidecar by a `-c
otel.exporter=...` override on its argv (the URL only) and the secret in
`OTEL_EXPORTER_OTLP_LOGS_HEADERS`, whose headers its OpenTelemetry SDK adds to the export: the
secret is never in the argv. Each model response is a log record `codex.sse_event` of kind
`response.completed` with the Responses API's `usage`. It computes no cost per request: the
pinned price table prices it.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from typing import Any

from sidecar.agent.clis.codex.hooks import codex_home
from sidecar.usage.reports import BadReport, UsageReport, count, model_name
from sidecar.usage.telemetry import SECRET_HEADER, Destination, Telemetry, TelemetryLaunch

EVENT = "codex.sse_event"
COMPLETED = "response.completed"
EXPORTER = "otlp-http"


def args(start: TelemetryLaunch) -> tuple[str, ...]:
    exporter = f'{{{EXPORTER}={{endpoint={json.dumps(start.endpoint)},protocol="json"}}}}'
    return ("-c", f"otel.exporter={exporter}")


def launch(start: TelemetryLaunch) -> Mapping[str, str]:
    return {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": f"{SECRET_HEADER}={start.secret}"}


def read(record: Mapping[str, Any]) -> UsageReport | None:
    """The API's `input_tokens` include the cached ones (a cache read here) and its
    `output_tokens` the reasoning ones. Codex sends each completed response twice, once without
    its counts: that one is no report."""
    if record.get("event.name") != EVENT or record.get("event.kind") != COMPLETED:
        return None
    if "input_token_count" not in record:
        return None
    prompt = count(record.get("input_token_count"), "input_token_count")
    cached = count(record.get("cached_token_count", 0), "cached_token_count")
    if cached > prompt:
        msg = f"cached_token_count {cached} is more than input_token_count {prompt}"
        raise BadReport(msg)
    return UsageReport(
        model=model_name(record.get("model")),
        input=prompt - cached,
        output=count(record.get("output_token_count", 0), "output_token_count"),
        cache_read=cached,
        cache_creation=count(record.get("cache_write_token_count", 0), "cache_write_token_count"),
        cost_usd=None,
    )


def destination(env: Mapping[str, str]) -> Destination | None:
    """The user's own `[otel] exporter = { otlp-http = { endpoint, headers } }` in CODEX_HOME's
    config.toml (the override replaces it); an unreadable file is none."""
    try:
        config = tomllib.loads((codex_home(env) / "config.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    otel = config.get("otel")
    exporter = otel.get("exporter") if isinstance(otel, dict) else None
    http = exporter.get(EXPORTER) if isinstance(exporter, dict) else None
    url = http.get("endpoint") if isinstance(http, dict) else None
    if not isinstance(http, dict) or not isinstance(url, str):
        return None
    if not url.startswith(("http://", "https://")):
        return None
    raw = http.get("headers")
    headers = raw if isinstance(raw, dict) else {}
    return Destination(url, {str(k): str(v) for k, v in headers.items()})


TELEMETRY = Telemetry(launch, read, destination, args)
