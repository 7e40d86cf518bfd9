"""`sleeve stop` of a bwrap run: SIGKILL after the stop-grace rule's time for the sleeve as it
was started (recorded with the run, `RunPlan.stop_timeout`), or after `--grace`.

The bwrap waiter is stood in for by a process that ignores SIGTERM (the OS seam: as a sleeve
whose shutdown never ends would); the stop's own timing is the point, not bwrap's."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.core.contract import runtime_grace
from sidecar.core.proc import start_time
from sidecar.launcher.slots import Project
from sidecar.launcher.state import RUNNING, Run, StateStore

from .helpers import Result

IGNORES_SIGTERM = ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done"]


@pytest.fixture
def stubborn() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(IGNORES_SIGTERM, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    proc.kill()
    proc.wait()
    proc.stdout.close()


def record(home: Path, project: Path, proc: subprocess.Popen[bytes], timeout: int | None) -> None:
    key = Project(project, home).key
    run = Run("r1", key, 1, "x", "bwrap", "shell", pid=proc.pid, status=RUNNING)
    run.pid_start, run.stop_timeout = start_time(proc.pid), timeout
    StateStore(home).upsert(run)


def stop_takes(sleeve: Callable[..., Result], project: Path, *args: str) -> float:
    began = time.monotonic()
    res = sleeve("stop", "1", "--project", project, *args)
    assert res.code == 0, res.err
    return time.monotonic() - began


def test_a_bwrap_stop_waits_what_the_run_was_started_with(
    home: Path,
    project: Path,
    stubborn: subprocess.Popen[bytes],
    sleeve: Callable[..., Result],
) -> None:
    record(home, project, stubborn, timeout=1)
    took = stop_takes(sleeve, project)
    assert stubborn.wait(5) == -9  # SIGTERM ignored: SIGKILL after the recorded time
    assert 1.0 <= took < runtime_grace()


def test_grace_overrides_the_recorded_time(
    home: Path,
    project: Path,
    stubborn: subprocess.Popen[bytes],
    sleeve: Callable[..., Result],
) -> None:
    record(home, project, stubborn, timeout=30)
    took = stop_takes(sleeve, project, "--grace", "0.5")
    assert stubborn.wait(5) == -9
    assert 0.5 <= took < 2.0
