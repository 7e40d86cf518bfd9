"""Start-up: exec -> `/health` 200, and exec -> fully healthy (CLI running, ttyd answering),
against the floor: a shell script that only starts tmux + ttyd and waits for ttyd's port."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave
from bench.procs import BenchError, make_sidecar, start_sidecar, stop_sidecar, stop_tree
from sidecar.core.layout import Layout
from sidecar.core.loopback import free_port
from sidecar.process.ttyd import find_ttyd

NAMES = ("start.health", "start.healthy")
FLOOR = Path(__file__).with_name("floor.sh")


def _sidecar(ctx: Context) -> dict[str, float]:
    sc = make_sidecar(ctx.scratch("st"))
    try:
        health, healthy = start_sidecar(sc)
    finally:
        stop_sidecar(sc)
    return {"health": health, "healthy": healthy}


def _floor(ctx: Context, ttyd: str) -> float:
    tmp = ctx.scratch("fl")
    sock, pidfile = tmp / "tmux.sock", tmp / "ttyd.pid"
    env = {**os.environ, "SHELL": "/bin/bash"}
    argv = [str(FLOOR), str(sock), str(free_port()), ttyd, str(pidfile)]
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
        took = time.perf_counter() - start
        if done.returncode != 0:
            msg = f"floor script failed: {done.stderr.decode(errors='replace')}"
            raise BenchError(msg)
        return took
    finally:
        with contextlib.suppress(OSError, ValueError):
            stop_tree(int(pidfile.read_text()))
        subprocess.run(["tmux", "-S", str(sock), "kill-server"], capture_output=True, check=False)


def run(ctx: Context) -> list[Figure]:
    ttyd = find_ttyd(Layout(ctx.scratch("bin")).ttyd_copy)
    got = interleave(
        ctx.pick(2, 11),
        {"sidecar": lambda: _sidecar(ctx), "floor": lambda: _floor(ctx, ttyd)},
    )
    floor = Baseline("tmux + ttyd script", got["floor"])
    return [
        Figure(
            "start.health",
            "start: exec → /health 200",
            "s",
            got["sidecar.health"],
            floor,
            at_most(0.4, "≤0.4 s; ratio to floor"),
        ),
        Figure(
            "start.healthy",
            "start: exec → fully healthy (CLI + ttyd)",
            "s",
            got["sidecar.healthy"],
            floor,
            at_most(0.8, "≤0.8 s; ratio to floor"),
        ),
    ]
