"""Benchmark: `sleeve slots` for a project with 100 slots, against ClaudeBox's bash id loop.

Run `python -m tests.launcher.bench_slots` from the repo root; prints one JSON object. Target:
`sleeve slots` at most 0.1 s beyond a bare interpreter start.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sidecar.launcher.slots import COUNTER_FILE, Project, slot_chain

from .helpers import CLAUDEBOX_ID_FUNCTIONS, REPO, SLEEVE

SLOTS = 100
ROUNDS = 7

# ClaudeBox's own functions: generate_container_name walks the chain from 0 for every slot.
CLAUDEBOX_IDS = (
    CLAUDEBOX_ID_FUNCTIONS + 'for ((n=1; n<=$N; n++)); do generate_container_name "$P" "$n"; done\n'
)


def best_of(argv: list[str], env: dict[str, str], rounds: int = ROUNDS) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="sleeve-bench-") as tmp:
        root = Path(tmp) / "project"
        root.mkdir()
        project = Project(root, Path(tmp) / "home")
        project.ensure()
        for slot_id in slot_chain(root, SLOTS)[1:]:
            (project.dir / slot_id / ".claude").mkdir(parents=True)
        (project.dir / COUNTER_FILE).write_text(str(SLOTS))
        env = {**os.environ, "SLEEVE_HOME": str(project.home), "PYTHONPATH": str(REPO)}
        bare = best_of([sys.executable, "-c", "pass"], env)
        slots = best_of([*SLEEVE, "slots", "--project", str(root), "--json"], env)
        start = time.perf_counter()
        out = subprocess.run(
            ["bash", "-c", CLAUDEBOX_IDS], env={**env, "P": str(root), "N": str(SLOTS)},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        bash = time.perf_counter() - start
        assert out.stdout.split() == slot_chain(root, SLOTS)[1:], "bash ids differ"
        in_process = statistics.median(_in_process(root, project.home) for _ in range(ROUNDS))
    print(
        json.dumps(
            {
                "slots": SLOTS,
                "interpreter_s": round(bare, 4),
                "sleeve_slots_s": round(slots, 4),
                "sleeve_slots_beyond_interpreter_s": round(slots - bare, 4),
                "sleeve_slots_in_process_s": round(in_process, 4),
                "claudebox_bash_ids_s": round(bash, 3),
                "target_met": slots - bare <= 0.1,
            }
        )
    )


def _in_process(root: Path, home: Path) -> float:
    import contextlib
    import io

    from sidecar.launcher.cli import main as sleeve

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        sleeve(["slots", "--project", str(root), "--json"], {"SLEEVE_HOME": str(home)})
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
