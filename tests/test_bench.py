"""`scripts/bench --quick` still produces every figure (not how fast: speed is the benchmark's
business, never a unit test's). Runs the real benchmark once, as a subprocess."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from bench.__main__ import GROUPS
from bench.figures import idle
from tests.harness import REPO

EXPECTED = [name for module in [*GROUPS.values(), idle] for name in module.NAMES]


@pytest.mark.slow
@pytest.mark.needs("wrk", "bwrap")
# The quick run's budget: every group briefly, several with the real Claude Code (a baseline too).
@pytest.mark.timeout(420)
def test_quick_bench_produces_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [str(REPO / "scripts" / "bench"), "--quick", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert out.exists(), done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    missing = [name for name in EXPECTED if name not in figures]
    assert not missing, f"figures missing: {missing}"
    broken = {
        name: fig.get("error", fig["value"])
        for name, fig in figures.items()
        if not isinstance(fig["value"], int | float) or not math.isfinite(fig["value"])
    }
    assert not broken, f"figures without a number: {broken}\n{done.stderr[-3000:]}"
    # A figure measured against a baseline has the baseline's samples, and a ratio where the
    # baseline is not zero (lost keystrokes: 0 against 0).
    unmeasured = [
        name
        for name, fig in figures.items()
        if fig["baseline"] is not None
        and not (
            fig["baseline"]["samples"]
            and (fig["baseline"]["value"] == 0 or isinstance(fig["ratio"], int | float))
        )
    ]
    assert not unmeasured, f"baselines without samples or ratio: {unmeasured}"
    with_baseline = {name for name, fig in figures.items() if fig["baseline"] is not None}
    assert len(with_baseline) >= 10, f"only {sorted(with_baseline)} have a baseline"
    assert done.returncode == 0, done.stderr[-3000:]
    # The table names every figure too.
    for fig in figures.values():
        assert fig["label"] in done.stdout
