"""Crash recovery: supervisor SIGKILL -> /status answers with the same CLI running (adopted by
the supervisor init started again), beside a cold start's exec -> fully healthy (CLI + ttyd).

Both come from the same sidecars: each round starts one (the cold start's sample), kills its
supervisor once (a first crash is restarted at once; later ones in the window back off) and
waits for /status to report the restart with the CLI's pid unchanged.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave, median
from bench.procs import (
    BenchError,
    cli_pid,
    get_json,
    make_sidecar,
    start_sidecar,
    stop_sidecar,
    wait_until,
)
from sidecar.core.layout import Layout

NAMES = ("crash.restart",)


def _supervisor(init_pid: int) -> psutil.Process:
    """init's child that runs init's own command line (the supervisor is a fork of init)."""
    init = psutil.Process(init_pid)
    argv = init.cmdline()
    for child in init.children():
        if child.cmdline() == argv:
            return child
    msg = "no supervisor under init"
    raise BenchError(msg)


def _adopted(port: int, pid: int) -> bool:
    try:
        code, body = get_json(port, "/status")
    except OSError:
        return False  # nothing listens yet
    return bool(code == 200 and body["sidecar_restarts"] == 1 and body["cli_pid"] == pid)


def _round(ctx: Context) -> dict[str, Any]:
    sc = make_sidecar(ctx.scratch("cr"), "pause")
    try:
        _, cold = start_sidecar(sc)
        assert sc.proc is not None
        pid = cli_pid(sc)
        if pid is None:
            msg = "no CLI pid before the crash"
            raise BenchError(msg)
        state_bytes = Layout(sc.state_dir).supervisor_state.stat().st_size
        supervisor = _supervisor(sc.proc.pid)
        start = time.perf_counter()
        supervisor.kill()
        wait_until(lambda: _adopted(sc.port, pid), 15, "the same CLI adopted", interval=0.002)
        took = time.perf_counter() - start
    finally:
        stop_sidecar(sc)
    return {"restart": took, "cold": cold, "state_bytes": state_bytes}


def run(ctx: Context) -> list[Figure]:
    got = interleave(ctx.pick(2, 7), {"sidecar": lambda: _round(ctx)})
    state_bytes = median(got["sidecar.state_bytes"])
    return [
        Figure(
            "crash.restart",
            "crash: supervisor SIGKILL → /status with the same CLI running",
            "s",
            got["sidecar.restart"],
            Baseline("cold start → fully healthy", got["sidecar.cold"]),
            at_most(1.0, "≤1 s; ratio to a cold start"),
            notes=f"state file {state_bytes:.0f} bytes, written on changes only",
            extra={"state_file_bytes": state_bytes},
        )
    ]
