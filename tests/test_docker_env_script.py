"""`scripts/docker-env stop` never stops the private engine while a test run is using it: a run
holds the engine's lock for its whole session, and an engine stopped under it failed every
end-to-end test left and the session's own teardown.

The engine is a stand-in: a real `sleep` whose pid is written where dockerd's goes (an orphan,
as an engine of an earlier run is, so that its end is not held up by an unreaped zombie). What
is tested is whether the script stops that pid, not Docker (which the e2e tests cover).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.e2e import dockerenv
from tests.harness import REPO


@pytest.fixture
def stand_in(tmp_path: Path) -> Iterator[psutil.Process]:
    started = subprocess.run(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    proc = psutil.Process(int(started.stdout))
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "dockerd.pid").write_text(started.stdout)
    yield proc
    with contextlib.suppress(psutil.NoSuchProcess):
        proc.kill()


def _stop(cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLEEVE_E2E_CACHE": str(cache)}
    return subprocess.run(
        [REPO / "scripts" / "docker-env", "stop"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_stop_refuses_while_a_test_run_holds_the_engine(
    tmp_path: Path, stand_in: psutil.Process
) -> None:
    with dockerenv.file_lock(tmp_path / "engine.lock"):
        done = _stop(tmp_path)
    assert done.returncode == 1
    assert "a test run is using the dockerd" in done.stderr, done.stderr
    assert stand_in.is_running(), "the engine in use was stopped"


def test_stop_stops_the_engine_nobody_is_using(tmp_path: Path, stand_in: psutil.Process) -> None:
    done = _stop(tmp_path)
    assert done.returncode == 0, done.stderr
    assert not stand_in.is_running(), "the script returns once the engine is gone"
