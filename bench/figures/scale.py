"""Scale: 1, 5 and 20 sleeves started at once with the `sleeve` launcher's bwrap runtime
(`sleeve run --runtime bwrap --shell`); the time until every one is fully healthy, and the
total USS of everything they run on the host (waiter, bwrap, sidecar, tmux, ttyd, shell).
The cost should grow linearly: per-sleeve cost at 20 against a single sleeve's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.context import Context
from bench.core import Baseline, Check, Figure, Target
from bench.procs import BenchError, fully_healthy, memory, tree, wait_until
from sidecar.core.loopback import free_ports
from sidecar.launcher.slots import Project

COUNTS = (1, 5, 20)
NAMES = (
    *(f"scale.{n}.{what}" for n in COUNTS for what in ("time", "uss")),
    "scale.linear.time",
    "scale.linear.uss",
)
TOKEN = "bench-token-0123456789abcdef"  # noqa: S105 - a test token for local sleeves
LINEAR = Target("≤1.25× one sleeve's (linear)", (Check("ratio", "<=", 1.25),))


class Launcher:
    def __init__(self, tmp: Path) -> None:
        self.project = (tmp / "project").resolve()
        self.project.mkdir()
        self.home = tmp / "home"
        self.sleeve = str(Path(sys.executable).with_name("sleeve"))
        drop = ("DOCKER_HOST", "SLEEVE_HOME")
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in drop and not k.startswith(("SIDECAR_", "SLEEVE_"))
        }
        self.env["SLEEVE_HOME"] = str(self.home)
        # Sleeves are closed by default; the caller's own token is the one they get.
        self.env["SIDECAR_TOKEN"] = TOKEN
        slots = Project(self.project, self.home)
        for _ in range(max(COUNTS)):
            slots.create()

    def cmd(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [self.sleeve, *args, "--project", str(self.project)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def runs(self) -> list[dict[str, object]]:
        done = subprocess.run(
            [self.sleeve, "ps", "--json"], env=self.env, capture_output=True, text=True, check=True
        )
        return [r for r in json.loads(done.stdout) if r["status"] == "running"]

    def start(self, count: int) -> tuple[float, float]:
        """Start `count` sleeves at once; seconds until all are fully healthy, total USS."""
        ports = free_ports(count)
        start = time.perf_counter()
        run = ["run", "--runtime", "bwrap", "--shell", "--wait", "120"]
        procs = [
            self.cmd(*run, "--slot", str(i + 1), "--port", str(port))
            for i, port in enumerate(ports)
        ]
        pending = set(ports)

        def all_healthy() -> bool:
            for proc in procs:
                if proc.poll() not in (None, 0):
                    _, err = proc.communicate()
                    msg = f"sleeve run failed ({proc.returncode}): {err.strip()[-800:]}"
                    raise BenchError(msg)
            pending.difference_update([p for p in list(pending) if fully_healthy(p, TOKEN)])
            return not pending

        wait_until(all_healthy, 120, f"{count} sleeves healthy", interval=0.005)
        took = time.perf_counter() - start
        for proc in procs:
            proc.communicate(timeout=60)
        runs = self.runs()
        if len(runs) != count:
            msg = f"sleeve ps lists {len(runs)} running sleeves, wanted {count}"
            raise BenchError(msg)
        procs_all = [p for r in runs for p in tree(int(str(r["pid"])))]
        return took, memory(procs_all).uss

    def stop_all(self, count: int) -> None:
        stops = [self.cmd("stop", str(i + 1), "--grace", "10") for i in range(count)]
        for proc in stops:
            proc.communicate(timeout=60)
        wait_until(lambda: not self.runs(), 30, "every sleeve stopped", interval=0.05)


def run(ctx: Context) -> list[Figure]:
    if shutil.which("bwrap") is None:
        msg = "bwrap not found (scripts/setup --test installs bubblewrap)"
        raise BenchError(msg)
    launcher = Launcher(ctx.scratch("sc"))
    results: dict[int, tuple[float, float]] = {}
    try:
        for count in COUNTS:
            try:
                results[count] = launcher.start(count)
            finally:
                launcher.stop_all(count)
    finally:
        for run_ in launcher.runs():  # whatever a failure left behind
            for proc in reversed(tree(int(str(run_["pid"])))):
                proc.kill()
    figures = []
    for count, (took, uss) in results.items():
        figures += [
            Figure(
                f"scale.{count}.time",
                f"scale: {count} bwrap sleeve{'s' if count > 1 else ''} at once → all healthy",
                "s",
                [took],
                notes="sleeve run --runtime bwrap --shell, launched in parallel",
            ),
            Figure(
                f"scale.{count}.uss",
                f"scale: {count} bwrap sleeve{'s' if count > 1 else ''}, total USS",
                "MiB",
                [uss],
                notes=f"{uss / count:.1f} MiB per sleeve, launcher waiter included",
            ),
        ]
    one_t, one_u = results[1]
    big = max(COUNTS)
    big_t, big_u = results[big]
    figures += [
        Figure(
            "scale.linear.time",
            f"scale: time per sleeve at {big} vs one sleeve",
            "s",
            [big_t / big],
            Baseline("1 sleeve", [one_t]),
            LINEAR,
        ),
        Figure(
            "scale.linear.uss",
            f"scale: USS per sleeve at {big} vs one sleeve",
            "MiB",
            [big_u / big],
            Baseline("1 sleeve", [one_u]),
            LINEAR,
        ),
    ]
    return figures
