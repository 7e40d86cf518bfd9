"""Helpers for the recording and usage tests: a loopback OTLP/HTTP receiver (the user's own
telemetry destination, the network seam), OTLP bodies, the CLI's own telemetry settings read
from its environment, recordings read back, and Debian's `asciinema cat` run on one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import psutil
from aiohttp import web

from tests.harness import Sidecar, wait_for
from tests.tools import require_executable


class OtlpReceiver:
    """An OTLP/HTTP endpoint on 127.0.0.1 in a thread of its own: keeps every request's path,
    headers and JSON body, answers 200."""

    def __init__(self) -> None:
        self.url = ""
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _take(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"null")
        with self._lock:
            headers = {k.lower(): v for k, v in request.headers.items()}
            self.requests.append((request.path, headers, body))
        return web.json_response({})

    async def _start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("POST", "/{tail:.*}", self._take)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def api_requests(self) -> list[dict[str, Any]]:
        """The attributes of every `api_request` log record received, as plain values."""
        with self._lock:
            bodies = [body for _, _, body in self.requests]
        return [
            r for body in bodies for r in log_records(body) if r.get("event.name") == "api_request"
        ]


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
