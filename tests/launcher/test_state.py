"""state.json and reconciliation: real processes for liveness, the real waiter for exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sidecar.core.proc import start_time
from sidecar.launcher.bwrap import spawn_detached
from sidecar.launcher.engine import parse_ps
from sidecar.launcher.runtimes import reconcile
from sidecar.launcher.state import COMPLETED, RUNNING, STOPPED, VANISHED, Run, StateStore
from sidecar.launcher.waiter import waiter_argv
from tests.harness import wait_for

from .helpers import LIVES_UNTIL_KILLED, REPO, Result


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(LIVES_UNTIL_KILLED)
    yield proc
    proc.kill()
    proc.wait()


def bwrap_run(run_id: str, pid: int | None, start: float | None, **kw: object) -> Run:
    run = Run(
        run_id, "proj_00000000", 1, "deadbeef", "bwrap", "shell", port=1, pid=pid, pid_start=start
    )
    run.status = RUNNING
    for key, value in kw.items():
        setattr(run, key, value)
    return run


def test_a_live_recorded_process_stays_running(sleeper: subprocess.Popen[bytes]) -> None:
    runs = [bwrap_run("a", sleeper.pid, start_time(sleeper.pid))]
    reconcile(runs, None)
    assert runs[0].status == RUNNING


def test_a_recorded_process_that_is_gone_becomes_failed_vanished() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = start_time(proc.pid)
    proc.wait()
    runs = [bwrap_run("a", proc.pid, start)]
    reconcile(runs, None)
    assert runs[0].status == VANISHED


def test_pid_reuse_is_detected_by_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    # The pid is alive, but it is not the process we recorded (it started at another time).
    start = start_time(sleeper.pid)
    assert start is not None
    runs = [bwrap_run("a", sleeper.pid, start - 100.0)]
    reconcile(runs, None)
    assert runs[0].status == VANISHED


def test_start_time_names_one_process_and_ignores_the_wall_clock(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """Boot-relative (/proc ticks): the value psutil gives moves with the wall clock's boot time,
    this one is the kernel's count since boot, the same however often it is read."""
    start = start_time(sleeper.pid)
    assert start is not None and start == start_time(sleeper.pid)
    assert 0 < start <= time.clock_gettime(time.CLOCK_BOOTTIME)
    other = subprocess.Popen([sys.executable, "-c", "pass"])
    other.wait()
    assert start_time(other.pid) is None  # gone (reaped)
    assert start_time(os.getpid()) != start  # another process, another start


def test_docker_runs_are_reconciled_from_one_ps_listing() -> None:
    fmt = "{name}\t{state}\t{status}\tproj_1\t{slot}\tabcd0123\t{port}\tshell\n"
    text = (
        fmt.format(name="c-done", state="exited", status="Exited (0) 1 minute ago", slot=1, port=1)
        + fmt.format(
            name="c-bad", state="exited", status="Exited (137) 2 hours ago", slot=2, port=2
        )
        + fmt.format(name="c-up", state="running", status="Up 5 minutes", slot=3, port=3)
        + fmt.format(name="c-stray", state="running", status="Up 1 second", slot=4, port=4444)
    )
    boxes = parse_ps(text)

    def docker_run(name: str) -> Run:
        return Run(name, "proj_1", 1, "x", "docker", "shell", container=name, status=RUNNING)

    runs = [docker_run(n) for n in ("c-done", "c-bad", "c-up", "c-gone")]
    reconcile(runs, boxes)
    status = {r.container: r.status for r in runs}
    assert status == {
        "c-done": COMPLETED,
        "c-bad": "failed (code 137)",
        "c-up": RUNNING,
        "c-gone": VANISHED,
        "c-stray": RUNNING,
    }
    stray = next(r for r in runs if r.container == "c-stray")
    assert stray.adopted and stray.slot == 4 and stray.port == 4444


def test_docker_runs_stay_as_recorded_when_docker_cannot_tell() -> None:
    runs = [Run("a", "p", 1, "x", "docker", "shell", container="c", status=RUNNING)]
    reconcile(runs, None)
    assert runs[0].status == RUNNING


def test_state_file_is_private_and_written_atomically(home: Path) -> None:
    store = StateStore(home)
    store.upsert(bwrap_run("a", 1, 1.0))
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    assert json.loads(store.path.read_text())["runs"][0]["id"] == "a"
    assert [p.name for p in home.iterdir() if p.name.endswith(".tmp")] == []


def test_parallel_writers_lose_no_record(home: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from sidecar.launcher.state import Run, StateStore;"
        "StateStore(Path(sys.argv[1])).upsert(Run(sys.argv[2], 'p', 1, 'x', 'bwrap', 'shell'))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(home), f"r{i}"], env=env)
        for i in range(12)
    ]
    assert all(p.wait(timeout=30) == 0 for p in procs)
    assert sorted(r.id for r in StateStore(home).read()) == sorted(f"r{i}" for i in range(12))


@pytest.mark.parametrize(
    "garbage",
    [b"", b'{"version": 1, "runs": [{"id"', b"\x00\xffnot json", b'{"runs": {"a": 1}}', b"[]"],
)
def test_corrupt_state_is_set_aside_and_rebuilt(
    home: Path, sleeve: Callable[..., Result], garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    home.mkdir(mode=0o700)
    (home / "state.json").write_bytes(garbage)
    res = sleeve("ps", "--json")
    assert res.code == 0 and json.loads(res.out) == []
    aside = [p for p in home.iterdir() if p.name.startswith("state.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    assert json.loads((home / "state.json").read_text())["runs"] == []
    assert "kept it as" in caplog.text


def start_waiter(home: Path, run_id: str, command: list[str]) -> tuple[int, float | None]:
    run = Run(
        run_id, "proj_1", 1, "abcd0123", "bwrap", "shell", port=9, log=str(home / f"{run_id}.log")
    )
    argv = waiter_argv(sys.executable, run, home, command)
    return spawn_detached(argv, {**os.environ, "PYTHONPATH": str(REPO)}, home / f"{run_id}.log")


@pytest.mark.parametrize(("code", "status"), [(0, COMPLETED), (3, "failed (code 3)")])
def test_the_waiter_records_the_exit_code(home: Path, code: int, status: str) -> None:
    home.mkdir(mode=0o700)
    pid, _ = start_waiter(home, "w", [sys.executable, "-c", f"raise SystemExit({code})"])
    wait_for(lambda: any(r.status != "starting" for r in StateStore(home).read()))
    (run,) = StateStore(home).read()
    assert (run.status, run.exit_code) == (status, code)
    os.waitpid(pid, 0)


def test_sigterm_to_the_waiter_is_forwarded_and_recorded_as_stopped(home: Path) -> None:
    home.mkdir(mode=0o700)
    ready = home / "ready"
    child = (
        "import pathlib, signal, sys; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
        f"pathlib.Path({str(ready)!r}).touch(); signal.pause()"
    )
    # `sh -c` stands in for bwrap: the waiter signals its child's child, the sandbox's PID 1.
    pid, _ = start_waiter(home, "w", ["sh", "-c", f'{sys.executable} -c "{child}"; exit $?'])
    wait_for(ready.exists)
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: bool(StateStore(home).read()))
    (run,) = StateStore(home).read()
    assert (run.status, run.exit_code) == (STOPPED, 0)
    os.waitpid(pid, 0)


def test_ps_adopts_a_running_waiter_without_a_record(
    home: Path, sleeve: Callable[..., Result]
) -> None:
    home.mkdir(mode=0o700)
    pid, _ = start_waiter(home, "lost", LIVES_UNTIL_KILLED)
    try:
        wait_for(lambda: "sidecar.launcher.waiter" in " ".join(psutil.Process(pid).cmdline()))
        runs = json.loads(sleeve("ps", "--json").out)
        assert [(r["id"], r["status"], r["adopted"], r["pid"]) for r in runs] == [
            ("lost", RUNNING, True, pid)
        ]
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    runs = json.loads(sleeve("ps", "--json").out)
    assert [r["status"] for r in runs] == [STOPPED]


def test_garbage_state_is_rebuilt_from_the_runs_still_alive(
    home: Path, sleeve: Callable[..., Result]
) -> None:
    home.mkdir(mode=0o700)
    pid, start = start_waiter(home, "alive-1", LIVES_UNTIL_KILLED)
    try:
        wait_for(lambda: "sidecar.launcher.waiter" in " ".join(psutil.Process(pid).cmdline()))
        StateStore(home).upsert(
            Run("alive-1", "proj_1", 1, "abcd0123", "bwrap", "shell", pid=pid, pid_start=start)
        )
        (home / "state.json").write_bytes(b'{"version": 1, "runs": [{"id": "alive-1", "pro')
        runs = json.loads(sleeve("ps", "--json").out)
        assert [(r["id"], r["status"], r["pid"]) for r in runs] == [("alive-1", RUNNING, pid)]
        assert any(p.name.startswith("state.json.corrupt-") for p in home.iterdir())
    finally:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)


def test_a_corrupt_state_never_overwrites_an_earlier_one_set_aside(
    home: Path, sleeve: Callable[..., Result]
) -> None:
    """Two corruptions in one second: earlier files sit on every name `<time>` could give."""
    home.mkdir(mode=0o700)
    now = int(time.time())
    decoys = {
        home / f"state.json.corrupt-{t}": f"earlier {t}".encode() for t in range(now, now + 30)
    }
    for path, data in decoys.items():
        path.write_bytes(data)
    for garbage in (b"first {", b"second ["):
        (home / "state.json").write_bytes(garbage)
        assert sleeve("ps", "--json").code == 0
    assert all(path.read_bytes() == data for path, data in decoys.items())
    kept = {p.read_bytes() for p in home.glob("state.json.corrupt-*") if p not in decoys}
    assert kept == {b"first {", b"second ["}
