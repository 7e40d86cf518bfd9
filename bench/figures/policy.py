"""The policy and the audit trail against the tree they were added to (BASELINE, run side by
side and interleaved): with the real Claude Code, from a permission request's decision (its
`approval-resolved` event) to its tool starting — decided by a policy rule here, by the API at
once there (the held hook's own path); the proxy's connection setup with every connection
audited; `/status` throughput (wrk) while 50 connections a second go through the proxy and into
the audit trail; and the idle memory with a policy file and the trail.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from bench import rigs, wrk
from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave, ratio_at_least
from bench.figures.egress import data_server, open_tunnel, proxy_port, setup_ms
from bench.procs import (
    BenchError,
    get_json,
    make_sidecar,
    memory,
    own_procs,
    post_json,
    wait_until,
)
from bench.procs import running as running_sidecar
from tests.agenttools import claude_env
from tests.harness import Sidecar

NAMES = ("policy.allow", "audit.setup", "audit.status", "policy.memory")
# The commit this work began from: the same sidecar without a policy or an audit trail.
BASELINE = "9a1f40f5c5d13442bc8303870262ea9b5bc57b35"
STAMP = "stamp.txt"  # the tool touches it: its mtime is when the tool ran
TOOL = f"touch {STAMP}"
POLICY = (
    "rules:\n  - name: stamp\n    match: {tool: Bash, command: '^touch stamp[.]txt$'}\n"
    "    action: allow\n"
)
RATE = 50  # audited connections a second while /status is measured


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Decisions:
    """The `approval-resolved` events of a sidecar, read by a thread: their times."""

    def __init__(self, port: int) -> None:
        self.times: list[float] = []
        self._conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
        self._conn.request("GET", "/events")
        events = self._conn.getresponse()
        json.loads(events.readline())  # the heartbeat: subscribed
        threading.Thread(target=self._read, args=(events,), daemon=True).start()

    def _read(self, events: http.client.HTTPResponse) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            while line := events.readline():
                event = json.loads(line)
                if event.get("type") == "approval-resolved":
                    self.times.append(_when(event["time"]))

    def close(self) -> None:
        self._conn.close()


@contextlib.contextmanager
def claude(tmp: Path, tree: Path | None, **env: str) -> Iterator[tuple[Sidecar, Decisions]]:
    stub = rigs.Stub(bash_command=TOOL).start()
    extra = dict(env) if tree is None else {**env, "PYTHONPATH": str(tree)}
    rig = rigs.SidecarRig(make_sidecar(tmp, cli="claude-code", **extra), stub)
    rig.sc.env_extra.update(claude_env(rig.sc, stub))
    rig.start()
    decisions = Decisions(rig.sc.port)
    try:
        yield rig.sc, decisions
    finally:
        decisions.close()
        rig.close()


def decision_to_tool(sc: Sidecar, decisions: Decisions, *, by_api: bool) -> float:
    """Milliseconds from one request's decision to its tool starting."""
    port, stamp = sc.port, sc.workspace / STAMP
    before = stamp.stat().st_mtime if stamp.exists() else 0.0
    seen = len(decisions.times)
    wait_until(lambda: get_json(port, "/status")[1]["agent"]["state"] == "idle", 30, "idle")
    code, body = post_json(port, "/input", {"text": "run it", "if_state": ["idle"]})
    if code != 202:
        raise BenchError(f"POST /input: {code} {body}")
    if by_api:
        listed = wait_until(lambda: get_json(port, "/approvals")[1]["approvals"], 30, "listed")
        code, body = post_json(port, f"/approvals/{listed[0]['id']}", {"decision": "allow"})
        if code != 200:
            raise BenchError(f"POST /approvals: {code} {body}")
    ran = wait_until(
        lambda: stamp.exists() and stamp.stat().st_mtime > before and stamp.stat().st_mtime,
        30,
        "the tool ran",
    )
    decided = wait_until(lambda: decisions.times[seen:], 10, "the decision's event")[0]
    return (ran - decided) * 1000


def _allow_figure(ctx: Context, tree: Path) -> Figure:
    policy = ctx.scratch("pf") / "policy.yaml"
    policy.write_text(POLICY)
    with (
        claude(ctx.scratch("pa"), None, SIDECAR_POLICY_FILE=str(policy)) as (ours, ours_events),
        claude(ctx.scratch("pb"), tree) as (base, base_events),
    ):
        samples = interleave(
            ctx.pick(3, 10),
            {
                "policy": lambda: decision_to_tool(ours, ours_events, by_api=False),
                "hook": lambda: decision_to_tool(base, base_events, by_api=True),
            },
        )
    extra = [p - h for p, h in zip(samples["policy"], samples["hook"], strict=True)]
    policy_ms = sorted(samples["policy"])[len(samples["policy"]) // 2]
    return Figure(
        "policy.allow",
        "policy allow: decision → the tool starts, more than the held hook's API path (pairs)",
        "ms",
        extra,
        target=at_most(10.0, "≤10 ms added"),
        notes=f"policy median {policy_ms:.1f} ms; the baseline is {BASELINE[:7]}'s API allow, "
        "both from the approval-resolved event to the tool's own start",
    )


CLIENTS = 5  # threads sharing the rate: one slow connection must not hold the others up


def traffic(proxy: int, port: int, stop: threading.Event, made: list[int]) -> None:
    """RATE / CLIENTS connections a second through the proxy (each one audited), until
    `stop`; each made is counted in `made`."""
    period = CLIENTS / RATE
    due = time.monotonic()
    while not stop.is_set():
        with contextlib.suppress(OSError, BenchError), open_tunnel(proxy, port) as s:
            s.recv(1)
            made.append(1)
        due += period
        stop.wait(max(0.0, due - time.monotonic()))


def status_rps(sc: Sidecar, proxy: int, hold: int, seconds: float, rates: list[float]) -> float:
    """/status requests a second (wrk) while the traffic runs; the traffic's own rate goes to
    `rates`."""
    stop = threading.Event()
    made: list[int] = []
    threads = [
        threading.Thread(target=traffic, args=(proxy, hold, stop, made), daemon=True)
        for _ in range(CLIENTS)
    ]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        return wrk.run(f"http://127.0.0.1:{sc.port}/status", seconds).rps
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        rates.append(len(made) / (time.monotonic() - began))


def _trail_figures(ctx: Context, tree: Path) -> list[Figure]:
    policy = ctx.scratch("pf") / "policy.yaml"
    policy.write_text(POLICY)
    with data_server() as (_, hold):
        env = {"SIDECAR_EGRESS_ALLOW": f"127.0.0.1:{hold}", "SIDECAR_POLICY_FILE": str(policy)}
        with (
            running_sidecar(ctx.scratch("ta"), **env) as ours,
            running_sidecar(ctx.scratch("tb"), PYTHONPATH=str(tree), **env) as base,
        ):
            # The base's /status may name a pid that is gone (see rigs.pane_cli_pid).
            clis = {"ours": rigs.pane_cli_pid(ours), "base": rigs.pane_cli_pid(base)}
            proxies = {name: proxy_port(pid) for name, pid in clis.items()}
            idle = (
                memory(own_procs(ours, clis["ours"])).uss
                - memory(own_procs(base, clis["base"])).uss
            )
            setups = interleave(
                ctx.pick(20, 200),
                {
                    "ours": lambda: setup_ms(lambda: open_tunnel(proxies["ours"], hold)),
                    "base": lambda: setup_ms(lambda: open_tunnel(proxies["base"], hold)),
                },
                warmup=5,
            )
            seconds = ctx.seconds(2, 5)
            made: list[float] = []
            rates = interleave(
                ctx.pick(1, 3),
                {
                    "ours": lambda: status_rps(ours, proxies["ours"], hold, seconds, made),
                    "base": lambda: status_rps(base, proxies["base"], hold, seconds, made),
                },
                warmup=0,
            )
    extra = [a - b for a, b in zip(setups["ours"], setups["base"], strict=True)]
    return [
        Figure(
            "audit.setup",
            "proxy connection setup with every connection audited, more than without (pairs)",
            "ms",
            extra,
            target=at_most(0.3, "≤0.3 ms more"),
            notes=f"baseline {BASELINE[:7]} (no audit trail); setup = connect, CONNECT, the far "
            "end's first byte",
        ),
        Figure(
            "audit.status",
            f"/status throughput while {RATE} connections/s are audited",
            "req/s",
            rates["ours"],
            Baseline(f"{BASELINE[:7]}, the same traffic, no audit trail", rates["base"]),
            ratio_at_least(0.98, "≥0.98× (≤2% less)"),
            notes=f"connections made a second: {', '.join(f'{r:.0f}' for r in made)}",
        ),
        Figure(
            "policy.memory",
            "idle memory with a policy file and the audit trail, more than without (USS)",
            "MiB",
            [idle],
            target=at_most(1.0, "≤1 MiB more"),
            notes=f"against {BASELINE[:7]} with the same environment (egress allowlist on)",
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    tree = rigs.baseline_tree(ctx.scratch("bt") / "tree", BASELINE)
    return [_allow_figure(ctx, tree), *_trail_figures(ctx, tree)]
