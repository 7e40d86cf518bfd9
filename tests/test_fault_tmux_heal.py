"""The fault that ended the sleeve for good (issue 20): the tmux server killed, then the server
the heal starts killed too the moment it appears. The sleeve must come back (one tmux server,
one CLI, healthy) and a resleeve must work again; a resleeve asked while tmux is dead must
complete; and the supervisor must never signal a pid it has not checked is still its process.

Real processes throughout: a sidecar with a private tmux socket and state dir, the CLIs of
tests/clis/, SIGKILLs from the test.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.faulttools import (
    RECOVER_WITHIN,
    census,
    explained,
    fault_clis,
    kill_new_server,
    only_server,
    wait_whole,
)
from tests.harness import Sidecar, stubborn_pids, wait_for
from tests.proctools import init_of, kill_supervisor, reaped, supervisor_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@pytest.fixture
def clis(short_tmp: Path) -> Path:
    return fault_clis(short_tmp)


@pytest.fixture
def sidecar(short_tmp: Path, clis: Path) -> Iterator[Callable[..., Sidecar]]:
    """A sidecar with the CLIs above, `cli` first; stopped at the end whatever happened."""
    made: list[Sidecar] = []

    def make(cli: str = "alpha", **env: str) -> Sidecar:
        sc = Sidecar(short_tmp, cli=cli, env_extra={"SIDECAR_CLI_CONFIG": str(clis), **env})
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.kill_everything()


def stubborn_ready(tmp: Path) -> int:
    """The stubborn CLI's pid once it ignores SIGHUP and SIGTERM (before, the hangup of a
    dying tmux server would end it at once)."""
    return wait_for(lambda: stubborn_pids(tmp / "stubborn.pids"), what="stubborn CLI ready")[0]


def stop_cleanly(sc: Sidecar) -> None:
    """SIGTERM: exit 0, nothing of the sleeve left."""
    assert sc.stop() == 0
    left = census(sc)
    assert not (left.tmux or left.cli_procs or left.ttyds), left


class Events:
    """The /events stream, read in the test's own thread (every read has a timeout above the
    heartbeat's 15 s)."""

    def __init__(self, sc: Sidecar) -> None:
        self._stream = urllib.request.urlopen(sc.url + "/events", timeout=30)
        assert json.loads(self._stream.readline())["type"] in ("heartbeat", "sidecar-restart")

    def resleeve_done(self) -> dict[str, Any]:
        """The next resleeve's `done` event (it is in the stream by the time the resleeve is
        over)."""
        while line := self._stream.readline():
            event = json.loads(line)
            if event["type"] == "resleeve" and event["phase"] == "done":
                return dict(event)
        msg = "the event stream ended before the resleeve's done event"
        raise AssertionError(msg)

    def __enter__(self) -> Events:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()


def resleeved(sc: Sidecar, old_cli: int, cli: str, killed: set[int]) -> dict[str, Any]:
    """Wait until a resleeve to `cli` is over and the sleeve whole with a new CLI."""
    status = sc.wait_status(
        lambda s: s["cli"] == cli and s["cli_running"] and s["cli_pid"] != old_cli,
        f"{cli} running with a new pid after the resleeve",
        timeout=RECOVER_WITHIN,
    )
    wait_whole(sc, RECOVER_WITHIN, "the sleeve whole after the resleeve", frozenset(killed))
    return status


# ---- the heal's own server killed ------------------------------------------------------------


@pytest.mark.parametrize("times", [1, 2], ids=["once", "twice-in-a-row"])
def test_the_heal_survives_its_new_tmux_server_killed_at_once(
    sidecar: Callable[..., Sidecar], times: int
) -> None:
    """SIGKILL the tmux server, then SIGKILL each new server the heal starts the moment it
    appears (within a /proc scan, about a millisecond), `times` times. The heal must try again:
    within RECOVER_WITHIN the sleeve is whole (healthy, one tmux server on its socket, one
    CLI, one ttyd), and a resleeve answers 202 and ends with a new CLI running. The default
    restart policy (`no`): a dead tmux server is not the CLI's exit, and is healed whatever the
    policy says."""
    sc = sidecar().start()
    with explained(sc):
        first_cli = sc.status()["cli_pid"]
        first = only_server(sc)
        killed = {first, first_cli}  # the CLI dies of the hangup
        os.kill(first, signal.SIGKILL)
        for n in range(times):
            new = kill_new_server(sc, set(killed), within=RECOVER_WITHIN)
            assert new is not None, f"no new tmux server within {RECOVER_WITHIN}s after kill {n}"
            killed.add(new[0])
        wait_whole(sc, RECOVER_WITHIN, "the sleeve whole after the heal's server died", killed)
        cli = sc.status()["cli_pid"]
        code, body = sc.post("/resleeve")
        assert code == 202, body
        resleeved(sc, cli, "alpha", killed | {cli})
        stop_cleanly(sc)


# ---- a resleeve while tmux is dead -----------------------------------------------------------


def test_a_resleeve_that_arrives_with_the_tmux_servers_death_completes(
    sidecar: Callable[..., Sidecar],
) -> None:
    """The supervisor is stopped (SIGSTOP) while the tmux server is SIGKILLed and the resleeve
    request is sent (the kernel queues the connection and its bytes), then continued: the
    server's death and the request reach its loop together. The answer is 202, the resleeve
    ends `done` with its CLI running, and the sleeve is whole with the new CLI."""
    sc = sidecar().start()
    with explained(sc), Events(sc) as events:
        old_cli = sc.status()["cli_pid"]
        server = only_server(sc)
        kill_supervisor(sc, signal.SIGSTOP)
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: reaped(server), what="the tmux server reaped")
        conn = http.client.HTTPConnection("127.0.0.1", sc.port, timeout=RECOVER_WITHIN)
        try:
            body = json.dumps({"cli": "beta"})
            conn.request("POST", "/resleeve", body, {"Content-Type": "application/json"})
            sup = supervisor_of(init_of(sc))
            assert sup is not None
            sup.send_signal(signal.SIGCONT)
            answer = conn.getresponse()
            assert answer.status == 202, answer.read()
        finally:
            conn.close()
        resleeved(sc, old_cli, "beta", {server, old_cli})
        done = events.resleeve_done()
        assert (done["cli"], done["state"]) == ("beta", "running"), json.dumps(done)
        stop_cleanly(sc)


def test_a_resleeve_whose_tmux_server_dies_while_it_stops_the_old_cli_completes(
    sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The old CLI ignores SIGTERM and SIGHUP, so the resleeve's stop waits out the grace
    (2 s); the tmux server is SIGKILLed then. The resleeve must not start the new CLI in the
    dead server's pane: it ends `done` with `beta` running, in one new tmux server."""
    sc = sidecar("stubborn", SIDECAR_STOP_GRACE="2").start()
    with explained(sc), Events(sc) as events:
        old_cli = stubborn_ready(short_tmp)
        server = only_server(sc)
        code, body = sc.post("/resleeve", {"cli": "beta"})
        assert code == 202, body
        sc.wait_status(lambda s: s["cli_state"] == "stopping", "the resleeve stopping stubborn")
        os.kill(server, signal.SIGKILL)
        resleeved(sc, old_cli, "beta", {server, old_cli})
        done = events.resleeve_done()
        assert (done["cli"], done["state"]) == ("beta", "running"), json.dumps(done)
        stop_cleanly(sc)


# ---- no signal to a pid that was not checked -------------------------------------------------


@pytest.fixture
def decoys() -> Iterator[list[subprocess.Popen[bytes]]]:
    made: list[subprocess.Popen[bytes]] = []
    yield made
    for decoy in made:
        decoy.kill()
        decoy.wait()


def decoy_at(pid: int, supervisor: psutil.Process, tries: int = 50) -> subprocess.Popen[bytes]:
    """A `sleep` that gets exactly `pid` (free again: its process died and was reaped). The
    kernel hands out the pid after ns_last_pid next, to whichever process forks first. The
    supervisor, whose heal forks tmux commands right now, is stopped meanwhile (SIGSTOP: a few
    milliseconds of its life); another process of the machine forking in between is waited out
    while it lives (a short-lived one) and the try repeated.

    The allocator is then moved back to where it was: left behind, it would hand the heal's
    new processes the pids freed since, such as the stubborn CLI's, killed after its grace, and
    a new process on a killed one's pid reads as a stale view of the sleeve."""
    last = int(NS_LAST_PID.read_text())
    supervisor.suspend()
    try:
        for _ in range(tries):
            wait_for(lambda: reaped(pid), timeout=10, what=f"pid {pid} free again")
            NS_LAST_PID.write_text(str(pid - 1))
            decoy = subprocess.Popen(["sleep", "600"])
            if decoy.pid == pid:
                return decoy
            decoy.kill()
            decoy.wait()
    finally:
        NS_LAST_PID.write_text(str(last))
        supervisor.resume()
    pytest.fail(f"the decoy did not get pid {pid} in {tries} tries")


def test_a_vanished_socket_never_gets_sigusr1_sent_to_a_reused_pid(
    sidecar: Callable[..., Sidecar],
    short_tmp: Path,
    decoys: list[subprocess.Popen[bytes]],
) -> None:
    """The once-a-second check: when the tmux socket is gone, tmux is asked to recreate it by
    SIGUSR1 to its server. Here the server is SIGKILLed and its socket deleted, and its pid is
    given at once to an unrelated process (a `sleep`, which SIGUSR1's default action would
    kill). The heal holds the dead server's pane for the grace (3 s: the stubborn CLI ignores
    SIGTERM and SIGHUP), so the check runs at least twice meanwhile. The decoy must live: a
    pid is signalled only once it is known to be the same process (its start time).

    The fake seam is the pid allocator: the test writes /proc/sys/kernel/ns_last_pid so that
    the decoy gets the dead server's pid now, as it would after a wrap-around of pid_max (a
    real reuse; the test only chooses when). That takes root."""
    if not os.access(NS_LAST_PID, os.W_OK):
        pytest.skip("writing /proc/sys/kernel/ns_last_pid takes root (CAP_SYS_ADMIN)")
    sc = sidecar("stubborn", SIDECAR_STOP_GRACE="3").start()
    with explained(sc):
        old_cli = stubborn_ready(short_tmp)
        server = only_server(sc)
        os.kill(server, signal.SIGKILL)
        wait_for(lambda: reaped(server), what="the tmux server reaped")
        (sc.state_dir / "tmux.sock").unlink()  # a SIGKILLed server leaves its socket file
        supervisor = supervisor_of(init_of(sc))
        assert supervisor is not None
        decoy = decoy_at(server, supervisor)
        decoys.append(decoy)
        wait_whole(sc, RECOVER_WITHIN, "the sleeve healed", frozenset({server, old_cli}))
        code = decoy.poll()
        assert code is None, (
            f"the decoy holding the dead tmux server's pid {server} ended with {code}"
            + (f" ({signal.Signals(-code).name})" if code is not None and code < 0 else "")
        )
        stop_cleanly(sc)
