"""Crash-only sidecar (CONTRACT.md "Crashes"): a supervisor that dies is started again by init and
adopts the running tmux session and CLI; too many crashes make init stop everything; a dead init
leaves nothing behind. Real processes throughout, as a local run and as PID 1 of a namespace.

The supervisor is found as init's child with init's own command line (it is a fork of init).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.client import IncompleteRead
from pathlib import Path
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.layout import Layout
from sidecar.process import persist
from sidecar.process.init import MAX_CRASHES
from sidecar.process.persist import ProcRef, SupervisorState
from tests.harness import (
    REPO,
    Sidecar,
    http,
    py_cli,
    stubborn_pids,
    stubborn_starts,
    wait_for,
    write_cli_config,
)
from tests.kernel_exits import KernelExits
from tests.proctools import (
    UNSHARE,
    init_of,
    kill_supervisor,
    none_left,
    ns_pid,
    restarted,
    supervisor_of,
    tmux,
)

HOOK = Path(__file__).resolve().parent / "crash_hook"
LEFT_BEHIND = "stopped the processes left behind"  # init's line when it had to clean up
NUMBERS = 5000
pytestmark = pytest.mark.timeout(180)


# ---- helpers ---------------------------------------------------------------------------------


def pane_history(sc: Sidecar) -> str:
    """Everything the pane has shown, scrollback included, wrapped lines joined."""
    return tmux(sc, "capture-pane", "-p", "-J", "-S", "-", "-E", "-", "-t", "main:0.0")


def server_pid(sc: Sidecar) -> int:
    return int(tmux(sc, "display-message", "-p", "-t", "main", "#{pid}").strip())


def tree_pids(sc: Sidecar) -> dict[int, float]:
    """Every process under init now (host pids), with its start time."""
    procs = init_of(sc).children(recursive=True)
    return {p.pid: p.create_time() for p in procs}


def edit_state(sc: Sidecar, change: Callable[[dict[str, Any]], None]) -> None:
    path = Layout(sc.state_dir).supervisor_state
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def stop(sc: Sidecar) -> int:
    """SIGTERM to init (unshare does not forward it to the namespace's PID 1); its exit code."""
    assert sc.proc is not None
    init_of(sc).send_signal(signal.SIGTERM)
    return sc.proc.wait(15)


def tty_of(sc: Sidecar, pid: int) -> str:
    """The terminal of `pid` (as the sidecar reports it: a namespace's own pid in one)."""
    if sc.wrapper:
        [pid] = [p.pid for p in init_of(sc).children(recursive=True) if ns_pid(p) == pid]
    return os.readlink(f"/proc/{pid}/fd/0")


@pytest.fixture(params=["local", "pid-namespace"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clis(short_tmp: Path) -> Path:
    return write_cli_config(
        short_tmp / "clis.yaml",
        {
            "numbers": py_cli("numbers.py", str(NUMBERS), "0.001", str(short_tmp / "numbers.pid")),
            "stubborn": {
                **py_cli("stubborn.py", str(short_tmp / "stubborn.pids"), "fresh"),
                "resume": py_cli("stubborn.py", str(short_tmp / "stubborn.pids"), "resumed")[
                    "command"
                ],
            },
            "pidfile": py_cli("pidfile.py", str(short_tmp / "pidfile.pid")),
        },
    )


@pytest.fixture
def sidecar(make_sidecar: Callable[..., Sidecar], clis: Path) -> Iterator[Callable[..., Sidecar]]:
    def make(cli: str, where: str = "local", **env: str) -> Sidecar:
        return make_sidecar(
            cli=cli,
            wrapper=UNSHARE if where == "pid-namespace" else [],
            env_extra={"SIDECAR_CLI_CONFIG": str(clis), **env},
        )

    yield make


# ---- the supervisor killed -------------------------------------------------------------------


def test_sigkill_while_the_cli_prints_keeps_the_cli_and_every_line_in_order(
    sidecar: Callable[..., Sidecar], short_tmp: Path, where: str
) -> None:
    """The CLI prints 5000 numbered lines, one a millisecond; the supervisor is SIGKILLed in the
    middle. The CLI never notices (same pid, same tty), the pane holds every line once and in
    order, the API answers again with `sidecar_restarts` 1 while the CLI is still printing."""
    sc = sidecar("numbers", where).start()
    cli = int(wait_for(lambda: (short_tmp / "numbers.pid").read_text(), what="numbers pid"))
    assert sc.status()["cli_pid"] == cli
    tty = tty_of(sc, cli)
    wait_for(lambda: "line 000300" in pane_history(sc), what="the flood under way")
    kill_supervisor(sc)
    status = restarted(sc, 1)
    assert "numbers done" not in pane_history(sc), "the restart came after the flood ended"
    assert status["cli_pid"] == cli
    assert status["cli"] == "numbers"
    assert tty_of(sc, cli) == tty
    wait_for(lambda: "numbers done" in pane_history(sc), timeout=30, what="the flood's end")
    numbers = [int(n) for n in re.findall(r"^line (\d{6})$", pane_history(sc), re.M)]
    assert numbers == list(range(1, NUMBERS + 1))
    assert sc.status()["cli_pid"] == cli
    assert "supervisor restart 1: adopted" in sc.log()
    assert stop(sc) == 0


def test_sigkill_while_idle_adopts_restarts_ttyd_and_tells_event_clients(
    sidecar: Callable[..., Sidecar],
) -> None:
    """Adoption of an idle shell: same CLI and tmux server, a new ttyd (the old one dies with
    its supervisor), /events opens with `sidecar-restart`, /health's uptime is the sidecar's
    (init's), and the state file is small and 0600."""
    sc = sidecar("shell").start()
    before = sc.status()
    assert before["sidecar_restarts"] == 0
    server = server_pid(sc)
    [old_ttyd] = [p for p in init_of(sc).children(recursive=True) if p.name() == "ttyd"]
    uptime = sc.get("/health")[1]["uptime"]
    state = Layout(sc.state_dir).supervisor_state
    assert state.stat().st_mode & 0o777 == 0o600
    assert state.stat().st_size < 4096
    stream = urllib.request.urlopen(sc.url + "/events", timeout=10)
    assert json.loads(stream.readline())["type"] == "heartbeat"
    kill_supervisor(sc)
    # The dead supervisor's stream is cut (its chunked body never ends), not left hanging.
    with stream, pytest.raises(IncompleteRead):
        stream.read()
    after = restarted(sc, 1)
    assert after["cli_pid"] == before["cli_pid"]
    assert server_pid(sc) == server
    sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd running again")
    assert not old_ttyd.is_running() or old_ttyd.status() == psutil.STATUS_ZOMBIE
    [new_ttyd] = [p for p in init_of(sc).children(recursive=True) if p.name() == "ttyd"]
    assert new_ttyd.pid != old_ttyd.pid
    assert http("GET", sc.url + "/terminal/")[0] == 200
    families = text_string_to_metric_families(sc.get("/metrics")[1].decode())
    restarts = {s.name: s.value for f in families for s in f.samples}
    assert restarts["sidecar_supervisor_restarts_total"] == 1
    assert sc.get("/health")[1]["uptime"] >= uptime
    with urllib.request.urlopen(sc.url + "/events", timeout=10) as events:
        first = json.loads(events.readline())
    assert first["type"] == "sidecar-restart"
    assert first["restarts"] == 1
    assert first["time"].endswith("Z")
    assert stop(sc) == 0
    assert not state.exists()  # a clean shutdown leaves nothing to adopt


def test_sigkill_during_a_resleeve_finishes_it_with_one_cli(
    sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The old CLI ignores SIGTERM, so the resleeve's stop waits out the grace (3 s): the
    supervisor is SIGKILLed then. The next one finishes the resleeve: the old CLI's tree is
    stopped, the new CLI runs, once."""
    sc = sidecar("stubborn", SIDECAR_STOP_GRACE="3").start()
    old = wait_for(lambda: stubborn_pids(short_tmp / "stubborn.pids"), what="stubborn CLI")
    assert sc.post("/resleeve", {"cli": "pidfile"})[0] == 202
    sc.wait_status(lambda s: s["cli_state"] == "stopping" and s["resleeving"], "resleeve stop")
    kill_supervisor(sc)
    status = restarted(sc, 1, timeout=20)
    assert status["cli"] == "pidfile"
    pidfile = short_tmp / "pidfile.pid"
    wait_for(lambda: int(pidfile.read_text()) == status["cli_pid"], what="the new CLI's pid")
    assert none_left(
        {pid: psutil.Process(pid).create_time() for pid in old if psutil.pid_exists(pid)}
    )
    tree = init_of(sc).children(recursive=True)
    clis = [p.pid for p in tree if any(a.endswith(".py") for a in p.cmdline()[1:2])]
    assert clis == [status["cli_pid"]]  # one CLI: the new one
    assert "finishing the resleeve stubborn -> pidfile" in sc.log()
    assert stop(sc) == 0


def test_a_cli_that_exits_while_no_supervisor_runs_is_handled_by_the_next(
    sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The supervisor is stopped (SIGSTOP), the CLI ends (SIGTERM: 143) and its pane dies, then
    the supervisor is SIGKILLed. The next one adopts the dead pane and handles the exit as its
    own: the exit code is recorded and the restart policy starts the CLI again."""
    sc = sidecar("pidfile", SIDECAR_RESTART="on-failure").start()
    pidfile = short_tmp / "pidfile.pid"
    old = int(wait_for(pidfile.read_text, what="CLI pid"))
    kill_supervisor(sc, signal.SIGSTOP)
    os.kill(old, signal.SIGTERM)
    wait_for(lambda: tmux(sc, "display-message", "-p", "-t", "main", "#{pane_dead}") == "1\n")
    kill_supervisor(sc)
    status = restarted(sc, 1)
    assert status["cli_pid"] != old
    assert "CLI pidfile exited with 143" in sc.log()
    assert "supervisor restart 1: adopted" in sc.log()
    wait_for(lambda: int(pidfile.read_text()) == status["cli_pid"], what="the CLI restarted")
    assert stop(sc) == 0


def test_sigkill_during_shutdown_completes_the_shutdown(
    sidecar: Callable[..., Sidecar], short_tmp: Path, where: str
) -> None:
    """SIGTERM, then the supervisor is SIGKILLed while it waits out the stubborn CLI's grace.
    init remembers the SIGTERM and starts a supervisor that only adopts and shuts down: the
    CLI tree, ttyd and tmux stopped by it (init finds nothing left to clean up), CURRENT.md
    `killed`, exit 0."""
    sc = sidecar("stubborn", where, SIDECAR_STOP_GRACE="3", SLEEVE_GOAL="Survive").start()
    wait_for(lambda: stubborn_pids(short_tmp / "stubborn.pids"), what="stubborn CLI")
    everyone = tree_pids(sc)
    init_of(sc).send_signal(signal.SIGTERM)
    sc.wait_status(lambda s: s["cli_state"] == "stopping", "shutdown stopping the CLI")
    kill_supervisor(sc)
    assert sc.proc is not None
    assert sc.proc.wait(20) == 0
    assert "shutting down at once" in sc.log()
    assert LEFT_BEHIND not in sc.log()
    assert none_left(everyone)
    current = (sc.workspace / ".cstack" / "CURRENT.md").read_text()
    assert re.search(r"^killed\s*$", current, re.M), current
    assert not Layout(sc.state_dir).supervisor_state.exists()


def test_sigterm_before_the_new_supervisors_handlers_is_a_graceful_stop(
    sidecar: Callable[..., Sidecar],
) -> None:
    """SIGTERM straight to a restarted supervisor while it is still importing, before its loop
    installed handlers (proof: aiohttp, which it imports before that, is not mapped yet right
    after the signal was sent). Signals stay blocked until then, so it shuts down gracefully
    and exits 0; by the default action it would die, and init would take that for a crash
    and start another."""
    sc = sidecar("shell").start()
    init = init_of(sc)
    old = kill_supervisor(sc)
    new = wait_for(
        lambda: (s := supervisor_of(init)) is not None and s.pid != old.pid and s,
        what="the new supervisor",
    )
    new.send_signal(signal.SIGTERM)
    maps = Path(f"/proc/{new.pid}/maps").read_text()
    assert "aiohttp/_http_parser" not in maps, "too late: the handlers may have been in place"
    assert sc.proc is not None
    assert sc.proc.wait(15) == 0
    assert LEFT_BEHIND not in sc.log()
    assert "supervisor crashed" in sc.log()  # the SIGKILL, and only that
    assert sc.log().count("supervisor crashed") == 1


def test_sigterm_while_a_supervisor_is_being_restarted_stops_the_sidecar(
    sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """A second crash within the window waits 0.5 s before the restart; a SIGTERM to init then
    (or just before init reaped the dead one) is not lost: a supervisor is started at once, only
    to adopt and shut down. Exit 0, CURRENT.md `killed`, nothing left for init to clean up."""
    sc = sidecar("shell", SLEEVE_GOAL="Stop cleanly").start()
    everyone = tree_pids(sc)
    kill_supervisor(sc)
    restarted(sc, 1)
    kill_supervisor(sc)
    init_of(sc).send_signal(signal.SIGTERM)
    assert sc.proc is not None
    assert sc.proc.wait(15) == 0
    log = sc.log()
    assert "shutting down at once" in log
    assert LEFT_BEHIND not in log
    assert none_left(everyone)
    current = (sc.workspace / ".cstack" / "CURRENT.md").read_text()
    assert re.search(r"^killed\s*$", current, re.M), current


def test_the_state_file_is_written_on_changes_only(sidecar: Callable[..., Sidecar]) -> None:
    """The once-a-second tick has run (it turned a CURRENT.md edit into an event) and the state
    file is untouched; a CLI exit, which changes the state, rewrites it."""
    sc = sidecar("shell", SLEEVE_GOAL="Idle").start()
    state = Layout(sc.state_dir).supervisor_state
    before = state.stat().st_mtime_ns, state.stat().st_ino
    with urllib.request.urlopen(sc.url + "/events", timeout=10) as events:
        assert json.loads(events.readline())["type"] == "heartbeat"
        current = sc.workspace / ".cstack" / "CURRENT.md"
        current.write_text(current.read_text().replace("Idle", "Still idle"))
        while json.loads(events.readline())["type"] != "progress-update":
            pass
    assert (state.stat().st_mtime_ns, state.stat().st_ino) == before
    psutil.Process(sc.status()["cli_pid"]).kill()
    sc.wait_status(lambda s: s["cli_state"] == "exited", "CLI exited")
    wait_for(lambda: json.loads(state.read_text())["cli_state"] == "exited", what="state saved")
    assert stop(sc) == 0


def test_an_uncaught_exception_in_the_loop_restarts_and_adopts(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """An exception escaping a supervisor task (here raised by tests/crash_hook/sitecustomize.py
    in the once-a-second tick: production code has no fault switch) ends the supervisor with
    1 and nothing stopped; init starts a new one, which adopts the CLI."""
    trigger = short_tmp / "fault"
    pythonpath = os.pathsep.join([str(HOOK), str(REPO), os.environ.get("PYTHONPATH", "")])
    sc = make_sidecar(
        cli="shell",
        env_extra={
            "PYTHONPATH": pythonpath.rstrip(os.pathsep),
            "SIDECAR_TEST_FAULT_FILE": str(trigger),
        },
    ).start()
    before = sc.status()
    first = supervisor_of(init_of(sc))
    assert first is not None
    trigger.touch()
    wait_for(lambda: not first.is_running() or first.status() == psutil.STATUS_ZOMBIE, what="crash")
    after = restarted(sc, 1)
    assert after["cli_pid"] == before["cli_pid"]
    log = sc.log()
    assert "fault injected by tests/crash_hook/sitecustomize.py" in log
    assert '"exit_code": 1' in log
    assert stop(sc) == 0


# ---- the state file does not match -------------------------------------------------------------


def spoil(kind: str, sc: Sidecar, unrelated: psutil.Process) -> None:
    path = Layout(sc.state_dir).supervisor_state
    if kind == "missing":
        path.unlink()
    elif kind == "truncated":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    elif kind == "another CLI":
        edit_state(sc, lambda d: d.update(cli="shell"))
    else:  # every pid in it now names an unrelated process (its real start time, even)
        ref = {"pid": unrelated.pid, "start": ProcRef.of(unrelated.pid).start}  # type: ignore[union-attr]
        edit_state(sc, lambda d: d.update(tmux=ref, pane=ref, cli_pid=ref, ttyd=ref))


@pytest.mark.parametrize("kind", ["missing", "truncated", "another CLI", "unrelated pid"])
def test_a_state_file_that_does_not_match_means_a_fresh_start(
    sidecar: Callable[..., Sidecar], short_tmp: Path, kind: str
) -> None:
    """The supervisor is stopped (SIGSTOP) while the file is spoiled, then SIGKILLed. The next
    one starts afresh: the old CLI and tmux server stopped, a new CLI in a new server. An
    unrelated process (a session leader, which dies on SIGTERM and SIGHUP) the file names is
    left untouched."""
    sc = sidecar("pidfile").start()
    pidfile = short_tmp / "pidfile.pid"
    old_cli = int(wait_for(pidfile.read_text, what="CLI pid"))
    old = {old_cli: psutil.Process(old_cli).create_time()}
    server = server_pid(sc)
    old[server] = psutil.Process(server).create_time()
    with subprocess.Popen(["sleep", "600"], start_new_session=True) as sleeper:
        try:
            unrelated = psutil.Process(sleeper.pid)
            kill_supervisor(sc, signal.SIGSTOP)
            spoil(kind, sc, unrelated)
            kill_supervisor(sc)
            status = restarted(sc, 1)
            assert status["cli_pid"] != old_cli
            wait_for(lambda: int(pidfile.read_text()) == status["cli_pid"], what="new CLI pid")
            assert server_pid(sc) != server
            assert none_left(old)
            assert "supervisor restart 1: fresh start" in sc.log()
            assert unrelated.status() == psutil.STATUS_SLEEPING
            assert sleeper.poll() is None
        finally:
            sleeper.kill()
    assert stop(sc) == 0


def test_tmux_server_gone_too_heals_with_the_resume_argv(
    sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The tmux server dies while no supervisor runs (stopped, then killed). The next one falls
    back to the heal: the old CLI (it ignores SIGHUP and outlives its server) is stopped, and a
    new session runs the CLI's resume argv."""
    record = short_tmp / "stubborn.pids"
    sc = sidecar("stubborn", SIDECAR_STOP_GRACE="1").start()
    old = wait_for(lambda: stubborn_pids(record), what="stubborn CLI")
    old_procs = {pid: psutil.Process(pid).create_time() for pid in old}
    server = psutil.Process(server_pid(sc))
    kill_supervisor(sc, signal.SIGSTOP)
    server.kill()
    server.wait(5)
    kill_supervisor(sc)
    status = restarted(sc, 1)
    second = wait_for(lambda: stubborn_starts(record)[1:], what="the CLI started again")[0]
    assert second["pid"] == status["cli_pid"]
    assert second["argv"][-1] == "resumed"
    assert none_left(old_procs)
    assert "supervisor restart 1: heal (tmux server gone" in sc.log()
    assert stop(sc) == 0


# ---- giving up, and init gone ------------------------------------------------------------------


def test_crash_loop_gives_up_stops_everything_and_exits_137(
    sidecar: Callable[..., Sidecar], where: str
) -> None:
    """The supervisor is SIGKILLed MAX_CRASHES times within the window (each time once it has
    adopted). init then stops everything itself and exits with the last crash's code, 128+9.
    In a namespace the kernel's exit records prove that every process ended before init did
    (what is left when PID 1 exits is SIGKILLed by the kernel, which would hide a leak)."""
    if where == "pid-namespace" and os.geteuid() != 0:
        pytest.skip("the kernel's process connector needs root")
    sc = sidecar("shell", where, SIDECAR_STOP_GRACE="1").start()
    init = init_of(sc)
    seen: dict[int, float] = {}
    with KernelExits() if sc.wrapper else contextlib.nullcontext() as kernel:
        for n in range(MAX_CRASHES):
            if n:
                restarted(sc, n)
            seen.update(tree_pids(sc))
            kill_supervisor(sc)
        assert sc.proc is not None
        assert sc.proc.wait(20) == 128 + signal.SIGKILL
        assert none_left(seen)
        if sc.wrapper:
            everyone = [*seen, init.pid]
            wait_for(
                lambda: all(kernel.of(pid) for pid in everyone),
                timeout=5,
                what=f"the kernel's exit events (events lost: {kernel.lost})",
            )
            init_ended = max(stamp for stamp, *_ in kernel.of(init.pid))
            late = [pid for pid in seen if max(kernel.of(pid))[0] >= init_ended]
            assert not late, f"left for the kernel to kill: {late}"
    log = sc.log()
    assert f"supervisor crashed, {MAX_CRASHES} times within 60 s: giving up" in log
    assert LEFT_BEHIND in log


def test_init_sigkilled_in_a_local_run_leaves_nothing_within_2s(
    sidecar: Callable[..., Sidecar],
) -> None:
    """init dies (SIGKILL: no chance to clean up). The supervisor is told at once by its
    parent-death signal and shuts down as on SIGTERM: CLI, ttyd, tmux and itself gone."""
    sc = sidecar("shell").start()
    everyone = tree_pids(sc)
    assert len(everyone) >= 5  # supervisor, tmux server, pane waiter, shell, ttyd
    assert sc.proc is not None
    sc.proc.kill()
    killed = time.monotonic()
    wait_for(lambda: none_left(everyone), timeout=5, what="every process of the sidecar gone")
    assert time.monotonic() - killed <= 2.0


# ---- the state file itself ---------------------------------------------------------------------


def test_state_records_round_trip_and_anything_else_is_no_record(tmp_path: Path) -> None:
    record = SupervisorState(
        init=ProcRef(1, 12.5),
        cli="shell",
        cli_state="running",
        argv=("bash", "-l"),
        tmux=ProcRef(7, 13.0),
        warnings=("w",),
    )
    path = Layout(tmp_path).supervisor_state
    persist.write_atomic(path, persist.encode(record))
    assert path.stat().st_mode & 0o777 == 0o600
    assert persist.load(path) == (record, "state file read")
    raw = path.read_bytes()
    data = json.loads(raw)
    bad = {
        "truncated": raw[:-10],
        "not JSON": b"\xff\xfe",
        "another version": json.dumps({**data, "version": 99}).encode(),
        "unknown field": json.dumps({**data, "surprise": 1}).encode(),
        "wrong type": json.dumps({**data, "tmux": {"pid": "7", "start": 1.0}}).encode(),
        "bool for int": json.dumps({**data, "backoff_n": True}).encode(),
        "missing field": json.dumps({k: v for k, v in data.items() if k != "cli"}).encode(),
        "a list": b"[]",
    }
    for why, content in bad.items():
        path.write_bytes(content)
        got, found = persist.load(path)
        assert got is None, why
        assert found.startswith("state file"), (why, found)
    path.unlink()
    assert persist.load(path) == (None, "no state file")
