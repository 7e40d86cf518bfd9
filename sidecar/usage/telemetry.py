"""How a CLI reports its usage to the sidecar: what its package declares (`Telemetry`: the
variables that make it export OTLP/HTTP JSON logs to the sidecar's loopback receiver with a
per-launch secret, and what one of its log records says), and where the user's own environment
sent those logs, so that the sidecar relays them there (`destination`): the CLI's logs go to one
endpoint only, and the sidecar takes that place.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.usage.reports import UsageReport

TELEMETRY_PATH = "/telemetry"  # a CLI POSTs its logs to TELEMETRY_PATH/<cli>/v1/logs
SECRET_HEADER = "X-Sidecar-Telemetry"  # noqa: S105 - the header's name, not a secret


@dataclass(frozen=True)
class TelemetryLaunch:
    endpoint: str  # the URL the CLI is to POST its OTLP logs to, exactly
    secret: str  # the per-launch secret it sends in SECRET_HEADER
    env: Mapping[str, str]  # the CLI's environment, as the user set it


@dataclass(frozen=True)
class Destination:
    """An OTLP/HTTP logs endpoint of the user's own, and the headers it wants."""

    url: str
    headers: Mapping[str, str]


def no_args(start: TelemetryLaunch) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Telemetry:
    """`launch`: the variables added to the CLI's environment; `read`: the usage in one log
    record's attributes (None: the record is no model request; raises `BadReport`);
    `destination`: where the user's own environment sends the CLI's logs (None: nowhere);
    `args`: arguments added to its argv (never the secret: every process can read an argv)."""

    launch: Callable[[TelemetryLaunch], Mapping[str, str]]
    read: Callable[[Mapping[str, Any]], UsageReport | None]
    destination: Callable[[Mapping[str, str]], Destination | None]
    args: Callable[[TelemetryLaunch], tuple[str, ...]] = no_args


def telemetry_url(base: str, cli: str) -> str:
    """The logs endpoint of `cli` on the sidecar whose API is at `base` (`http://host:port`)."""
    return f"{base}{TELEMETRY_PATH}/{cli}/v1/logs"


def headers_of(value: str) -> dict[str, str]:
    """`OTEL_EXPORTER_OTLP_*HEADERS`: `key=value` pairs, comma-separated, values URL-encoded."""
    found = {}
    for pair in value.split(","):
        key, sep, raw = pair.partition("=")
        if sep and key.strip():
            found[key.strip()] = urllib.parse.unquote(raw.strip())
    return found


def otlp_logs_destination(env: Mapping[str, str]) -> Destination | None:
    """Where the OpenTelemetry SDK's standard variables send logs, for an OTLP/HTTP exporter:
    the logs endpoint as given, else the general endpoint + `/v1/logs`, else the SDK's default;
    None when logs are not exported with OTLP, or over gRPC (which the sidecar does not relay)."""
    exporters = {e.strip() for e in env.get("OTEL_LOGS_EXPORTER", "").split(",")}
    if "otlp" not in exporters:
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_LOGS_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol.strip() == "grpc":
        return None
    url = env.get("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "").strip()
    if not url:
        base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
        url = base.rstrip("/") + "/v1/logs"
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        return None
    raw = env.get("OTEL_EXPORTER_OTLP_LOGS_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS", "")
    return Destination(url, headers_of(raw))
