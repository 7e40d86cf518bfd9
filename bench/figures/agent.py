"""Agent state: a hook event -> its `agent-state` line on /events.

A sidecar runs a CLI with the `hooks` source (a stand-in `claude` that only sleeps: what is
measured is the sidecar's path, from the hook's POST, as Claude Code makes it, with the secret
from the settings file the sidecar wrote, to the event line a client of /events reads).
Baseline, interleaved: the same POST to a hook route that refuses it (wrong secret), i.e. the
HTTP round trip alone. Claude Code's own Notification hook, the alternative an envoy would have
without ours, comes ~6 s after a permission prompt and ~60 s after a turn ends (README).
"""

from __future__ import annotations

import http.client
import json
import stat
import time
from pathlib import Path

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave
from bench.procs import BenchError, make_sidecar, start_sidecar, stop_sidecar, wait_until
from tests.harness import write_cli_config

NAMES = ("agent.hook_event",)
EVENTS = ("UserPromptSubmit", "Stop")  # working, idle, working, ...


def _fake_claude(tmp: Path) -> Path:
    path = tmp / "bin" / "claude"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\nexec sleep 3600\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _post(port: int, path: str, secret: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        body = json.dumps({"session_id": "x", "hook_event_name": path.rsplit("/", 1)[1]})
        conn.request("POST", path, body=body, headers={"X-Sidecar-Hook": secret})
        return conn.getresponse().status
    finally:
        conn.close()


def run(ctx: Context) -> list[Figure]:
    tmp = ctx.scratch("ag")
    claude = _fake_claude(tmp)
    entry = {"command": [str(claude)], "state": "hooks"}
    config = write_cli_config(tmp / "clis.yaml", {"fake": entry})
    sc = make_sidecar(tmp / "sc", cli="fake", SIDECAR_CLI_CONFIG=str(config))
    try:
        start_sidecar(sc)
        settings = sc.state_dir / "claude-code-hooks.json"
        wait_until(settings.exists, 10, "the hook settings file")
        secret = json.loads(settings.read_text())["hooks"]["Stop"][0]["hooks"][0]["headers"][
            "X-Sidecar-Hook"
        ]
        stream = http.client.HTTPConnection("127.0.0.1", sc.port, timeout=10)
        stream.request("GET", "/events")
        events = stream.getresponse()
        json.loads(events.readline())  # the heartbeat: subscribed
        n = ctx.pick(20, 200)
        turn = iter(range(10**9))

        def hook_to_event() -> float:
            event = EVENTS[next(turn) % 2]
            t0 = time.perf_counter()
            if _post(sc.port, f"/hooks/claude-code/{event}", secret) != 204:
                msg = "the hook was refused"
                raise BenchError(msg)
            while True:
                line = json.loads(events.readline())
                if line.get("type") == "agent-state":
                    return time.perf_counter() - t0

        def refused() -> float:
            t0 = time.perf_counter()
            _post(sc.port, "/hooks/claude-code/Stop", "wrong")
            return time.perf_counter() - t0

        samples = interleave(n, {"hook": hook_to_event, "refused": refused})
        ours, base = samples["hook"], samples["refused"]
        stream.close()
    finally:
        stop_sidecar(sc)
    return [
        Figure(
            "agent.hook_event",
            "agent state: hook event → agent-state line on /events",
            "s",
            ours,
            baseline=Baseline("the hook's HTTP round trip alone (refused)", base),
            target=at_most(0.1, "≤100 ms median (Claude Code's own Notification: ~6 s / ~60 s)"),
        )
    ]
