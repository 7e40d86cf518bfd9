"""Idle CPU: a sidecar (shell CLI) left alone for 60 s; CPU seconds of its whole process tree
over the wall time. The window opens before the other groups and a timer closes it 60 s later
while they run: nothing talks to this sidecar meanwhile, and CPU time counts only its own
processes' work, so sharing the machine with the other groups does not inflate it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

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
    length: float
    after: dict[int, float] = field(default_factory=dict)
    end: float = 0.0
    closed: threading.Event = field(default_factory=threading.Event)
    timer: threading.Timer | None = None

    def close_window(self) -> None:
        self.after = cpu_seconds(self.procs)
        self.end = time.monotonic()
        self.closed.set()


def begin(ctx: Context) -> Window:
    sc = make_sidecar(ctx.scratch("id"))
    try:
        start_sidecar(sc)
        assert sc.proc is not None
        procs = tree(sc.proc.pid)
        length = ctx.seconds(5, 60)
        window = Window(sc, procs, cpu_seconds(procs), time.monotonic(), length)
        window.timer = threading.Timer(length, window.close_window)
        window.timer.daemon = True
        window.timer.start()
        return window
    except BaseException:
        stop_sidecar(sc)
        raise


def finish(ctx: Context, window: Window) -> list[Figure]:
    if not window.closed.wait(window.length + 30):
        msg = "the idle window did not close"
        raise BenchError(msg)
    wall = window.end - window.start
    after = window.after
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
    if window.timer is not None:
        window.timer.cancel()
    stop_sidecar(window.sc)
