"""Approvals with the real Claude Code: from the moment a permission request is visible to an
envoy (listed by `GET /approvals`) to the moment its tool starts (the tool writes its own start
time), answered through the API at once, beside today's keys path (`POST /input` Enter, which
the sidecar holds until the dialog on screen can take it). Interleaved, one sidecar.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import rigs
from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave
from bench.procs import BenchError, get_json, post_json, wait_until

NAMES = ("approvals.api_allow",)
STARTS = "starts.txt"  # each run of the tool appends the time it started
TOOL = f"date +%s.%N >> {STARTS}"


def _started(workspace: Path, runs: int) -> float | None:
    try:
        lines = (workspace / STARTS).read_text().split()
    except FileNotFoundError:
        return None
    return float(lines[runs]) if len(lines) > runs else None


def _enter(port: int) -> tuple[int, Any]:
    """Enter through `POST /input` as a client that reads `changed` sends it: again while the
    agent stays `waiting` (`changed` false: the dialog may not have taken it; Claude Code
    ignores keys for a moment after it draws a prompt, longer on a loaded machine), three
    times at most. A 409 on a later try means it left `waiting`: the earlier Enter was taken."""
    enter = {"keys": ["Enter"], "if_state": ["waiting"]}
    code, body = post_json(port, "/input", enter, timeout=10)
    for _ in range(2):
        if code != 202 or body.get("changed") is not False:
            break
        again = post_json(port, "/input", enter, timeout=10)
        if again[0] == 409:
            break
        code, body = again
    return code, body


def run(ctx: Context) -> list[Figure]:
    rig = rigs.claude_sidecar(ctx.scratch("ap"), TOOL, None)
    port, workspace = rig.sc.port, rig.sc.workspace
    runs = iter(range(10**6))

    def idle() -> bool:
        code, body = get_json(port, "/status")
        return code == 200 and body["agent"]["state"] == "idle"

    def cycle(answer: str) -> float:
        run_no = next(runs)
        wait_until(idle, 30, "the agent idle")
        code, body = post_json(port, "/input", {"text": "run it", "if_state": ["idle"]})
        if code != 202:
            raise BenchError(f"POST /input: {code} {body}")

        def listed() -> list[dict[str, str]]:
            return list(get_json(port, "/approvals")[1]["approvals"])

        request = wait_until(listed, 30, "the request listed")[0]
        seen = time.time()
        if answer == "api":
            code, body = post_json(port, f"/approvals/{request['id']}", {"decision": "allow"})
        else:
            code, body = _enter(port)
        if code not in (200, 202):
            raise BenchError(f"the answer was refused: {code} {body}")
        what = f"the tool started (answered by {answer}: {code} {body})"
        started = wait_until(lambda: _started(workspace, run_no), 30, what)
        return started - seen

    try:
        n = ctx.pick(3, 10)
        samples = interleave(n, {"api": lambda: cycle("api"), "keys": lambda: cycle("keys")})
    finally:
        rig.close()
    return [
        Figure(
            "approvals.api_allow",
            "approvals: request listed → its tool starts, allowed through the API",
            "s",
            samples["api"],
            baseline=Baseline(
                "the same, Enter through POST /input (held for the dialog)", samples["keys"]
            ),
            target=at_most(0.1, "≤100 ms median"),
        )
    ]
