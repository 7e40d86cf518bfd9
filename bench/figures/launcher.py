"""`sleeve slots` for a project with 100 slots: its time beyond a bare interpreter start, and
its whole time against a bash loop deriving the same 100 ids with the `cksum` program
(ClaudeBox's method), interleaved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave
from bench.procs import BenchError
from sidecar.launcher.slots import Project, slot_chain

NAMES = ("launcher.slots", "launcher.slots_vs_cksum")
SLOTS = 100
# ClaudeBox's ids: crc0 = cksum(root), crcN = cksum(decimal text of crcN-1), printed %08x.
# One walk of the chain (ClaudeBox's own generate_container_name restarts from 0 per slot).
CKSUM_LOOP = r"""
v=$(printf '%s' "$P" | cksum | cut -d' ' -f1)
for ((n = 1; n <= N; n++)); do
    v=$(printf '%s' "$v" | cksum | cut -d' ' -f1)
    printf '%08x\n' "$v"
done
"""


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    took = time.perf_counter() - start
    if done.returncode != 0:
        msg = f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-500:]}"
        raise BenchError(msg)
    return took, done.stdout


def run(ctx: Context) -> list[Figure]:
    tmp = ctx.scratch("la")
    root, home = (tmp / "project").resolve(), tmp / "home"
    root.mkdir()
    project = Project(root, home)
    for _ in range(SLOTS):
        project.create()
    want = slot_chain(root, SLOTS)[1:]
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_HOST", "SLEEVE_HOME")}
    env["SLEEVE_HOME"] = str(home)
    sleeve = str(Path(sys.executable).with_name("sleeve"))
    if not os.access(sleeve, os.X_OK):
        msg = f"{sleeve} is missing: run scripts/setup --test"
        raise BenchError(msg)

    def interpreter() -> float:
        return _timed([sys.executable, "-c", "pass"], env)[0] * 1000

    def slots() -> float:
        took, out = _timed([sleeve, "slots", "--project", str(root), "--json"], env)
        ids = [s["id"] for s in json.loads(out)["slots"]]
        if ids != want:
            msg = "sleeve slots listed other ids than the cksum chain"
            raise BenchError(msg)
        return took * 1000

    def cksum() -> float:
        took, out = _timed(["bash", "-c", CKSUM_LOOP], {**env, "P": str(root), "N": str(SLOTS)})
        if out.split() != want:
            msg = "the cksum loop derived other ids than the sleeve launcher"
            raise BenchError(msg)
        return took * 1000

    got = interleave(ctx.pick(3, 15), {"python": interpreter, "sleeve": slots, "cksum": cksum})
    beyond = [s - p for s, p in zip(got["sleeve"], got["python"], strict=True)]
    return [
        Figure(
            "launcher.slots",
            f"launcher: `sleeve slots` ({SLOTS} slots) beyond interpreter start",
            "ms",
            beyond,
            Baseline("`python -c pass`", got["python"]),
            at_most(100, "≤100 ms beyond interpreter start"),
            notes="value = sleeve slots − python -c pass, per interleaved round",
        ),
        Figure(
            "launcher.slots_vs_cksum",
            f"launcher: `sleeve slots` ({SLOTS} slots), whole command",
            "ms",
            got["sleeve"],
            Baseline("bash + cksum loop", got["cksum"]),
            notes="ratio < 1: faster than ClaudeBox's method",
        ),
    ]
