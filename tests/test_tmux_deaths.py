"""A tmux server (or ttyd) that dies is told apart by the signal it died of: a crash (SIGSEGV,
SIGABRT) from a kill (SIGKILL, SIGTERM), in /metrics (`sidecar_tmux_server_deaths_total{signal}`),
the heal's event and one log line. init reaps the tmux server (its orphan) and reports each wait
status to the supervisor on a pipe (`sidecar.process.init.REPORT`, read by
`sidecar.process.deaths.Reaped`).

Real processes: a sidecar with a private tmux socket, signals sent by the test. A SIGSEGV sent
with kill() ends a process with the very wait status a segfault gives (the kernel's seam).
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import signal
import urllib.request
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from sidecar.process.deaths import UNKNOWN, Death, Reaped, of_shell_code
from sidecar.process.init import REPORT
from tests.faulttools import census, explained
from tests.harness import Sidecar, wait_for
from tests.metricstools import TOKEN, scrape, value

pytestmark = pytest.mark.timeout(60)


# ---- telling them apart ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("death", "kind", "label", "text"),
    [
        (Death(signal.SIGSEGV, None), "crash", "SIGSEGV", "crashed (SIGSEGV)"),
        (Death(signal.SIGABRT, None), "crash", "SIGABRT", "crashed (SIGABRT)"),
        (Death(signal.SIGBUS, None), "crash", "SIGBUS", "crashed (SIGBUS)"),
        (Death(signal.SIGKILL, None), "kill", "SIGKILL", "was killed (SIGKILL)"),
        (Death(signal.SIGTERM, None), "kill", "SIGTERM", "was killed (SIGTERM)"),
        (Death(signal.SIGHUP, None), "kill", "SIGHUP", "was killed (SIGHUP)"),
        (Death(None, 0), "exit", "none", "exited with 0"),
        (Death(None, 1), "exit", "none", "exited with 1"),
        (UNKNOWN, "unknown", "unknown", "died (how is not known)"),
    ],
)
def test_a_death_is_a_crash_a_kill_an_exit_or_unknown(
    death: Death, kind: str, label: str, text: str
) -> None:
    assert (death.kind, death.label, death.describe()) == (kind, label, text)


def test_wait_statuses_and_returncodes_name_the_signal() -> None:
    """The forms the sidecar meets: a wait status (init's reports), asyncio's -N (ttyd), a
    shell's 128+N (the pane's waiter reports the CLI's status so)."""
    pid = os.fork()
    if pid == 0:
        faulthandler.disable()  # pytest's: it would print a traceback first
        os.kill(os.getpid(), signal.SIGABRT)
    _, status = os.waitpid(pid, 0)
    assert Death.of_status(status) == Death(signal.SIGABRT, None)
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert Death.of_status(status) == Death(None, 3)
    assert Death.of_returncode(-9).describe() == "was killed (SIGKILL)"
    assert Death.of_returncode(0).describe() == "exited with 0"
    assert Death.of_returncode(None) == UNKNOWN
    assert of_shell_code(139) == " (128+11: SIGSEGV, a crash)"
    assert of_shell_code(143) == " (128+15: SIGTERM, a kill)"
    assert of_shell_code(0) == of_shell_code(128) == of_shell_code(None) == of_shell_code(255) == ""


async def test_reports_match_a_process_by_pid_and_start_time() -> None:
    """A report for the same pid with another start time is another process (a reused pid):
    not taken for the one asked about. A report written after the question is waited for."""
    reaped = Reaped()
    read_end, write_end = os.pipe()
    reaped.listen(read_end)
    try:
        os.write(write_end, REPORT.pack(4242, 100.0, signal.SIGKILL))  # a signal's wait status
        assert await reaped.death_of(4242, 100.0) == Death(signal.SIGKILL, None)
        assert await reaped.death_of(4242, 999.0, within=0.05) == UNKNOWN
        assert await reaped.death_of(4242, None) == Death(signal.SIGKILL, None)
        # Half a record, then the rest: read whole.
        record = REPORT.pack(77, 5.5, signal.SIGSEGV)
        asker = asyncio.ensure_future(reaped.death_of(77, 5.5))
        os.write(write_end, record[:5])
        await asyncio.sleep(0.01)  # sleep-ok: lets the loop read the first half on its own
        assert not asker.done()
        os.write(write_end, record[5:])
        assert await asyncio.wait_for(asker, 1.0) == Death(signal.SIGSEGV, None)
        # init gone (the pipe closed): questions are answered at once.
        os.close(write_end)
        write_end = -1
        await asyncio.wait_for(_until(lambda: not reaped.listening), 1.0)
        assert await asyncio.wait_for(reaped.death_of(1, None, within=30), 1.0) == UNKNOWN
    finally:
        reaped.close()
        if write_end >= 0:
            os.close(write_end)


async def test_without_init_a_death_is_unknown_at_once() -> None:
    """A supervisor not started by `sidecar run` has no reports to wait for."""
    assert await asyncio.wait_for(Reaped().death_of(1, None, within=30), 1.0) == UNKNOWN


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        await asyncio.sleep(0.005)  # sleep-ok: a poll, bounded by the caller's wait_for


# ---- a real sidecar ----------------------------------------------------------------------------


def error_events(sc: Sidecar, count: int) -> Callable[[], list[str]]:
    """Opens /events now; the returned function reads until `count` error events came and
    returns their messages (each read has a timeout above the heartbeat's 15 s)."""
    request = urllib.request.Request(
        sc.url + "/events", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    stream = urllib.request.urlopen(request, timeout=30)
    assert json.loads(stream.readline())["type"] == "heartbeat"

    def read() -> list[str]:
        found: list[str] = []
        with stream:
            while len(found) < count and (line := stream.readline()):
                event: dict[str, Any] = json.loads(line)
                if event["type"] == "error" and event["message"].startswith("tmux server"):
                    found.append(event["message"])
        return found

    return read


def kill_server_and_wait_heal(sc: Sidecar, sig: signal.Signals) -> int:
    [server] = census(sc).servers
    before = sc.status()["cli_pid"]
    os.kill(server.pid, sig)
    sc.wait_status(
        lambda s: s["cli_running"] and s["cli_pid"] != before, f"healed after {sig.name}"
    )
    return server.pid


def test_the_tmux_servers_death_says_crash_or_kill_by_its_signal(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """SIGSEGV then SIGKILL to the tmux server: both healed; /metrics counts one of each by
    signal (the other crash and kill signals stay 0), the heal's error event and the log line
    say `crashed (SIGSEGV)` and `was killed (SIGKILL)` with the server's pid; no tmux warning
    (this tmux is the suite's, ≥ 3.4). ttyd killed by SIGABRT reads as a crash too."""
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN}).start()
    with explained(sc):
        assert not [w for w in sc.status()["warnings"] if "tmux" in w]
        first = scrape(sc)
        for name in ("SIGSEGV", "SIGABRT", "SIGKILL", "SIGTERM"):
            assert value(first, "sidecar_tmux_server_deaths_total", signal=name) == 0
        events = error_events(sc, 2)
        segv = kill_server_and_wait_heal(sc, signal.SIGSEGV)
        killed = kill_server_and_wait_heal(sc, signal.SIGKILL)
        assert events() == [
            f"tmux server {segv} crashed (SIGSEGV); session recreated",
            f"tmux server {killed} was killed (SIGKILL); session recreated",
        ]
        after = scrape(sc)
        assert value(after, "sidecar_tmux_server_deaths_total", signal="SIGSEGV") == 1
        assert value(after, "sidecar_tmux_server_deaths_total", signal="SIGKILL") == 1
        assert value(after, "sidecar_tmux_server_deaths_total", signal="SIGABRT") == 0
        assert value(after, "sidecar_tmux_heals_total") == 2
        log = sc.log()
        assert f"tmux server {segv} crashed (SIGSEGV); recreating the session" in log
        assert f"tmux server {killed} was killed (SIGKILL); recreating the session" in log

        assert sc.proc is not None
        ttyds = [
            p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ttyd"
        ]
        [ttyd] = ttyds
        ttyd.send_signal(signal.SIGABRT)
        wait_for(lambda: "ttyd: crashed (SIGABRT)" in sc.log(), timeout=10, what="ttyd's crash")


def test_a_pane_that_ends_with_its_server_is_a_heal_not_a_cli_exit(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """The pane's end can reach the sidecar before its server's: a SIGKILL closes the server's
    ptys (the pane's process gets SIGHUP and exits) before the kernel reports the server's exit.
    Here that order is made certain: the server is stopped, the pane's process killed, and the
    server killed while the sidecar asks it how the pane ended. It is the server's death (the
    heal, counted by its signal), never an exit of the CLI (none counted, no `exited` event)."""
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN}).start()
    with explained(sc):
        events = error_events(sc, 1)
        [server] = census(sc).servers
        before = sc.status()["cli_pid"]
        pane = psutil.Process(before).ppid()  # the pane's process: the waiter that runs the CLI
        os.kill(server.pid, signal.SIGSTOP)
        os.kill(pane, signal.SIGKILL)

        def asking() -> bool:  # the sidecar's question that the stopped server cannot answer
            return any(any("pane_dead_status" in a for a in p.argv) for p in census(sc).tmux)

        wait_for(asking, timeout=10, what="the sidecar asking tmux how the pane ended")
        os.kill(server.pid, signal.SIGKILL)
        sc.wait_status(lambda s: s["cli_running"] and s["cli_pid"] != before, "healed")
        assert events() == [f"tmux server {server.pid} was killed (SIGKILL); session recreated"]
        after = scrape(sc)
        assert value(after, "sidecar_tmux_server_deaths_total", signal="SIGKILL") == 1
        assert value(after, "sidecar_tmux_heals_total") == 1
        exits = {
            labels: n for (name, labels), n in after.items() if name == "sidecar_cli_exits_total"
        }
        assert exits == {}, exits
