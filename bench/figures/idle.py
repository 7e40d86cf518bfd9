"""Idle CPU: a sidecar (shell CLI) left alone for 60 s; CPU seconds of its whole process tree
over the wall time. The window opens before the other groups and closes after them: nothing
talks to this sidecar meanwhile, and CPU time counts only its own processes' work."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from bench.context import Context
from bench.core import Figure, at_most
from bench.procs import BenchError, cpu_seconds, make_sidecar, start_sidecar, stop_sidecar, tree
from tests.harness import Sidecar

NAMES = ("idle.cpu",)


@dataclass
class Window:
    sc: Sidecar
    procs: list[psutil.Process]
    cpu: dict[int, float]
    start: float


def begin(ctx: Context) -> Window:
    sc = make_sidecar(ctx.scratch("id"))
    try:
        start_sidecar(sc)
        assert sc.proc is not None
        procs = tree(sc.proc.pid)
        return Window(sc, procs, cpu_seconds(procs), time.monotonic())
    except BaseException:
        stop_sidecar(sc)
        raise


def finish(ctx: Context, window: Window) -> list[Figure]:
    length = ctx.seconds(5, 60)
    left = window.start + length - time.monotonic()
    if left > 0:
        time.sleep(left)  # sleep-ok: the measurement window itself
    wall = time.monotonic() - window.start
    after = cpu_seconds(window.procs)
    gone = set(window.cpu) - set(after)
    if gone:
        msg = f"sidecar processes {sorted(gone)} exited during the idle window"
        raise BenchError(msg)
    used = sum(after[pid] - window.cpu[pid] for pid in window.cpu)
    return [
        Figure(
            "idle.cpu",
            f"idle CPU over {wall:.0f} s (whole sleeve: {len(after)} processes)",
            "%",
            [100 * used / wall],
            target=at_most(0.1, "≤0.1 %"),
            notes=f"{used:.3f} CPU s in {wall:.1f} s",
        )
    ]


def close(window: Window) -> None:
    stop_sidecar(window.sc)
