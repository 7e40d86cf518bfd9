"""PID-1 behaviour in a real PID namespace (`unshare --pid --fork --mount-proc`): the sidecar is
PID 1 there, reaps orphans, keeps exit statuses exact, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.process.init import MAX_CRASHES
from tests.harness import (
    CLIS,
    PYTHONPATH,
    Sidecar,
    py_cli,
    stubborn_pids,
    wait_for,
    write_cli_config,
)
from tests.kernel_exits import KernelExits
from tests.proctools import UNSHARE, namespace_init, ns_pid

pytestmark = pytest.mark.needs("unshare")


def zombies(root: psutil.Process) -> list[int]:
    out = []
    for proc in root.children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return out


@pytest.fixture
def in_namespace(make_sidecar: Callable[..., Sidecar], short_tmp: Path) -> Callable[..., Sidecar]:
    def make(cli: str, clis: dict[str, dict[str, object]], **env: str) -> Sidecar:
        config = write_cli_config(short_tmp / "clis.yaml", clis)
        return make_sidecar(
            cli=cli, wrapper=UNSHARE, env_extra={"SIDECAR_CLI_CONFIG": str(config), **env}
        )

    return make


def test_sidecar_is_pid_1_and_reaps_1000_orphans(
    in_namespace: Callable[..., Sidecar], short_tmp: Path
) -> None:
    marker = short_tmp / "orphans.done"
    sc = in_namespace("orphans", {"orphans": py_cli("orphans.py", "1000", str(marker))}).start()
    init = namespace_init(sc)
    assert ns_pid(init) == 1
    assert "sidecar" in " ".join(init.cmdline())
    wait_for(marker.exists, timeout=20, what="1000 orphans made")
    seen = time.monotonic()
    wait_for(lambda: not zombies(init), timeout=2, what="no zombies in the namespace")
    assert time.monotonic() - seen <= 2
    assert sc.get("/health")[1]["status"] == "healthy"


def test_exit_statuses_stay_exact_under_the_reaper(in_namespace: Callable[..., Sidecar]) -> None:
    """A blanket waitpid(-1) in the supervisor would turn these into 255 or 0."""
    sc = in_namespace("seven", {"seven": py_cli("exit_with.py", "7")}).start(wait_healthy=False)
    status = sc.wait_status(
        lambda s: s["cli_state"] == "exited" and s["ttyd_state"] == "running",
        "CLI exited, ttyd running",
    )
    assert status["cli_exit_code"] == 7
    # ttyd is an asyncio child: its death by SIGKILL must read as such (-9), not as exit 255.
    init = namespace_init(sc)
    [ttyd] = [p for p in init.children(recursive=True) if p.name() == "ttyd"]
    ttyd.kill()
    wait_for(lambda: "ttyd: was killed (SIGKILL)" in sc.log(), timeout=5, what="ttyd's exit status")
    sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd back")
    # libtmux's subprocess calls still see real statuses: a resleeve works end to end.
    assert sc.post("/resleeve", {"cli": "shell"})[0] == 202
    sc.wait_status(lambda s: s["cli"] == "shell" and s["cli_running"], "shell running")
    assert "unknown child process" not in sc.log().lower()


def run_init_program(tmp: Path, *args: str) -> tuple[int, list[dict[str, Any]]]:
    """tests/clis/init_statuses.py as PID 1 of a fresh namespace: its exit code, its JSON lines."""
    env = dict(
        os.environ,
        PYTHONPATH=PYTHONPATH,
    )
    proc = subprocess.run(
        [*UNSHARE, sys.executable, str(CLIS / "init_statuses.py"), *args],
        env=env,
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report; stdout {proc.stdout!r} stderr {proc.stderr!r}"
    return proc.returncode, lines


def test_run_as_init_keeps_exit_statuses_exact_while_it_reaps_a_stream_of_orphans(
    short_tmp: Path,
) -> None:
    """While init reaps orphans (a factory makes them all along, and a tmux server daemonizes
    into one), `work` sees exact statuses from `subprocess.run` (3, in a thread as libtmux runs
    it), asyncio's `create_subprocess_exec` (5) and libtmux (`has-session` of a missing session:
    1). A reaper that shared work's process would turn those into 0 (subprocess's answer to a
    stolen child) and 255 (asyncio's); work then exits 1 and prints every mismatch."""
    code, lines = run_init_program(short_tmp, "statuses", str(short_tmp))
    report = lines[-1]
    assert report["init_pid"] == 1  # run_as_init ran as the namespace's PID 1
    assert report["work_ppid"] == 1  # and work was its child
    assert report["bad"] == []
    assert report["orphans"] >= 50  # orphans really were dying all along
    assert report["code"] == 0
    assert code == 0


@pytest.mark.parametrize("signo", [signal.SIGKILL, signal.SIGUSR1])
def test_run_as_init_returns_128_plus_n_when_work_dies_by_signal_n_every_time(
    short_tmp: Path, signo: signal.Signals
) -> None:
    """init starts work again after each death (a crash), and gives up at the MAX_CRASHES-th
    within the window with that death's code."""
    code, lines = run_init_program(short_tmp, "signal", str(int(signo)))
    runs = [line for line in lines if "work_ppid" in line]
    assert runs == [{"work_ppid": 1, "restarts": n} for n in range(MAX_CRASHES)]
    crashes = [line for line in lines if line.get("logger") == "sidecar.process.init"]
    assert [c["signal"] for c in crashes] == [signo.name] * MAX_CRASHES
    assert "giving up" in crashes[-1]["msg"]
    assert lines[-1] == {"init_pid": 1, "code": 128 + signo}
    assert code == 128 + signo


@pytest.mark.skipif(os.geteuid() != 0, reason="the kernel's process connector needs root")
def test_sigterm_stops_every_process_it_started_before_the_supervisor_exits(
    in_namespace: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """When PID 1 exits, the kernel SIGKILLs whatever is left in its namespace, so "nothing is
    left afterwards" proves nothing. The witness is the kernel's own record of exits (the
    netlink process connector: exact order, exit statuses). The kernel kills a namespace's
    processes only when its PID 1 exits, which is after the supervisor has ended; so the CLI,
    its child (both ignore SIGHUP and SIGTERM), the pane's waiter and ttyd must have ended
    strictly before the supervisor did, and tmux (told to exit, not waited for) must have ended
    by itself with status 0, not by the kernel's SIGKILL (status 9)."""
    pids = short_tmp / "stubborn.pids"
    sc = in_namespace(
        "stubborn", {"stubborn": py_cli("stubborn.py", str(pids))}, SIDECAR_STOP_GRACE="1"
    ).start()
    cli, cli_child = wait_for(lambda: stubborn_pids(pids), what="stubborn CLI ready")
    init = namespace_init(sc)
    [supervisor] = [p for p in init.children() if "-m sidecar run" in " ".join(p.cmdline())]
    members = [p for p in init.children(recursive=True) if p.pid != supervisor.pid]
    started = {p.pid: p.name() for p in members}  # host pids: what the kernel reports
    assert {cli, cli_child} <= {ns_pid(p) for p in members}  # the CLI wrote namespace pids
    names = sorted(started.values())
    assert "ttyd" in names and "sh" in names, names
    assert any(n.startswith("tmux") for n in names), names
    with KernelExits() as kernel:
        begun = time.monotonic()
        init.send_signal(signal.SIGTERM)
        assert sc.proc is not None
        assert sc.proc.wait(10) == 0
        assert time.monotonic() - begun <= 1 + 1  # the bound: the grace + 1 s
        everyone = [*started, supervisor.pid, init.pid]
        wait_for(
            lambda: all(kernel.of(pid) for pid in everyone),
            timeout=5,
            what=f"the kernel's exit events of {everyone} (events lost: {kernel.lost})",
        )
    # The supervisor has ended once its last thread has; from then on init may exit and the
    # kernel SIGKILL whatever is left.
    supervisor_ended = max(stamp for stamp, *_ in kernel.of(supervisor.pid))
    assert supervisor_ended < max(stamp for stamp, *_ in kernel.of(init.pid))
    ended = {pid: max(kernel.of(pid)) for pid in started}  # (stamp, tid, pid, wait status)
    # Shutdown waits for the CLI tree and for ttyd, so they end strictly before it does.
    late = {
        f"{started[pid]} {pid}": f"{(stamp - supervisor_ended) / 1e6:.1f} ms after, status {status}"
        for pid, (stamp, _, _, status) in ended.items()
        if started[pid] != "tmux: server" and stamp >= supervisor_ended
    }
    assert not late, f"outlived the supervisor, left for the kernel to kill: {late}"
    # tmux is told to exit (kill-server) and then ends by itself: exit status 0. Left to the
    # kernel it would be SIGKILLed (status 9) when init exits.
    [tmux_status] = [st for pid, (*_, st) in ended.items() if started[pid] == "tmux: server"]
    assert tmux_status == 0, ended
    assert "SIGKILL to 2 processes" in sc.log()  # the stubborn pair, after the grace
