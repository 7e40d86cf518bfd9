"""Helpers for the recording and usage tests: what a loopback receiver standing for the user's
own OTLP/HTTP telemetry destination (the network seam) got, OTLP bodies, the CLI's own telemetry
settings read from its environment, recordings read back, and Debian's `asciinema cat` run on
one."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import psutil

from tests.harness import Sidecar, wait_for
from tests.notifytools import Receiver
from tests.tools import require_executable


def api_requests(receiver: Receiver) -> list[dict[str, Any]]:
    """The attributes of every `api_request` log record a receiver got, as plain values."""
    records = [r for seen in receiver.seen for r in log_records(seen.json())]
    return [r for r in records if r.get("event.name") == "api_request"]


def log_records(body: Any) -> list[dict[str, Any]]:
    """Every log record's attributes in an OTLP JSON logs body, as plain values."""
    found = []
    for resource in body.get("resourceLogs", []):
        for scope in resource.get("scopeLogs", []):
            for record in scope.get("logRecords", []):
                attrs = {}
                for item in record.get("attributes", []):
                    value = item.get("value", {})
                    attrs[item["key"]] = next(iter(value.values())) if value else None
                found.append(attrs)
    return found


def otlp_body(*records: dict[str, Any]) -> bytes:
    """An OTLP JSON logs request holding one log record per mapping of attributes."""

    def value(v: Any) -> dict[str, Any]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": v}
        if isinstance(v, float):
            return {"doubleValue": v}
        return {"stringValue": v}

    logs = [
        {"attributes": [{"key": k, "value": value(v)} for k, v in attrs.items()]}
        for attrs in records
    ]
    body = {"resourceLogs": [{"scopeLogs": [{"logRecords": logs}]}]}
    return json.dumps(body).encode()


def api_request(**counts: Any) -> dict[str, Any]:
    """An `api_request` record as Claude Code sends one (counts given override the defaults)."""
    return {
        "event.name": "api_request",
        "model": "claude-test-model",
        "input_tokens": 100,
        "output_tokens": 10,
        "cache_read_tokens": 0,
        "cache_creation_tokens": 0,
        "cost_usd": 0.001,
        **counts,
    }


def cli_telemetry(sc: Sidecar) -> tuple[str, dict[str, str]]:
    """Where the running CLI sends its logs and the headers it sends, read from its environment
    (the test runs as the CLI's user, as an agent inside the sleeve could)."""
    pid = sc.status()["cli_pid"]
    env = psutil.Process(pid).environ()
    headers = dict(h.split("=", 1) for h in env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"].split(","))
    return env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"], headers


def recording_lines(path: Path) -> list[Any]:
    """Every line of an asciicast file, decoded (the header first)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def markers(path: Path) -> list[str]:
    return [event[2] for event in recording_lines(path)[1:] if event[1] == "m"]


def asciinema_cat(path: Path, tmp: Path) -> str:
    """What a person sees after Debian's `asciinema cat` printed the file into a terminal of the
    recording's size: it runs in a tmux pane (a real terminal, which it needs: it opens /dev/tty),
    whose screen and scrollback are read once it is done."""
    asciinema = require_executable("asciinema")
    header = recording_lines(path)[0]
    tmux = ["tmux", "-S", str(tmp / "cat.sock"), "-f", "/dev/null"]
    size = ["-x", str(header["width"]), "-y", str(header["height"])]
    run = [*tmux, "new-session", "-d", *size, asciinema, "cat", str(path)]
    subprocess.run(
        [
            *run,
            ";",
            "set",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "set",
            "-g",
            "history-limit",
            "50000",
        ],
        check=True,
        capture_output=True,
    )
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    [*tmux, "display", "-p", "-t", "0", "#{pane_dead}"],
                    capture_output=True,
                    text=True,
                ).stdout.strip()
                == "1"
            ),
            30,
            what="asciinema cat done",
        )
        shown = subprocess.run(
            [*tmux, "capture-pane", "-p", "-J", "-S", "-", "-t", "0"],
            capture_output=True,
            text=True,
            check=True,
        )
        return shown.stdout
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)
