"""Shared fixtures: real sidecar processes on free loopback ports, torn down even on failure;
the `needs` marker (a missing tool: tests/tools.py); the seed of the random test order; the
tmux that scripts/setup builds first on PATH."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Sidecar
from tests.tools import TMUX_BIN, require_chromium, require_executable


def pytest_configure(config: pytest.Config) -> None:
    # Every tmux of the run (libtmux's, each sidecar's, each sleeve's) is the one scripts/setup
    # built: Debian 12's 3.3a crashes under the suite's pane output. Without it (no setup run)
    # the tests run what PATH has, and tests/test_tmux_version.py says so.
    if (TMUX_BIN / "tmux").exists():
        os.environ["PATH"] = os.pathsep.join([str(TMUX_BIN), os.environ.get("PATH", os.defpath)])
    config.addinivalue_line(
        "markers",
        "needs(*executables): the test runs these tools; a missing one is a skip outside CI "
        "and a failure in CI (tests/tools.py)",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Here and not at import time: a module-level skipif would decide before the rule can.
    for mark in item.iter_markers("needs"):
        for name in mark.args:
            require_executable(name)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The seed even under -q (pytest-randomly prints it only in the header -q hides), so any
    order that failed can be run again."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int) and getattr(config.option, "randomly_reorganize", True):
        terminalreporter.write_line(f"random test order: repeat it with --randomly-seed={seed}")


@pytest.fixture
def chromium() -> str:
    """The path of a headless Chromium (or a skip/failure as tests/tools.py decides)."""
    return require_chromium()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: a tmux socket path must stay under the 108-byte UNIX socket limit."""
    path = Path(tempfile.mkdtemp(prefix="sc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_sidecar(short_tmp: Path) -> Iterator[Callable[..., Sidecar]]:
    made: list[Sidecar] = []

    def make(**kw: Any) -> Sidecar:
        sub = short_tmp / f"s{len(made)}"
        sub.mkdir()
        sc = Sidecar(sub, **kw)
        made.append(sc)
        return sc

    yield make
    # Every sidecar's processes before any tmux server: sidecars may share a state dir, and a
    # server stopped under one still running is healed by it into a server nothing stops.
    for sc in made:
        sc.kill_processes()
    for sc in made:
        sc.kill_servers()
