"""`sleeve ps` shows each running sleeve's agent state and what it waits for, from its `/status`
asked with its token: a real bwrap sleeve; a real sidecar recorded the way `sleeve run` records
one, beside sleeves that answer nothing, refuse, or were recorded without a token — each `?`
with why, and `ps` takes no longer for them.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sidecar.core.loopback import free_port
from sidecar.core.proc import start_time
from sidecar.launcher.agents import DEADLINE, printable
from sidecar.launcher.launch import new_run_id
from sidecar.launcher.state import RUNNING, Run, StateStore
from tests.harness import Sidecar, wait_for
from tests.standin import waiting_sidecar

from .helpers import Result

TOKEN = "ps-agent-token-0123456789"
LONG = "rm -rf build && echo " + "the-rest-of-a-long-command " * 8


def column(table: list[str], row: str, name: str) -> str:
    """The value of column `name` in `row` of the `sleeve ps` table (columns are aligned)."""
    return row[table[0].index(name) :].split(maxsplit=1)[0]


def ps_json(sleeve_proc: Callable[..., Result], **env: str) -> list[dict[str, object]]:
    res = sleeve_proc("ps", "--json", extra_env=env)
    assert res.code == 0, res.err
    return list(json.loads(res.out))


@pytest.mark.needs("bwrap")
def test_ps_shows_the_agent_of_a_bwrap_sleeve_and_none_once_it_stopped(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    port = free_port()
    args = ("run", "--project", str(project), "--runtime", "bwrap", "--shell", "--port", str(port))
    res = sleeve_proc(*args, "--wait", "40")
    waiter: psutil.Process | None = None
    try:
        assert res.code == 0, res.err
        (run,) = ps_json(sleeve_proc)
        waiter = psutil.Process(int(str(run["pid"])))
        # The shell goes idle once its pane has been quiet (3 s by default).
        last: list[dict[str, object]] = []

        def idle() -> dict[str, object] | None:
            last[:] = ps_json(sleeve_proc)[:1]
            return last[0] if last and last[0]["agent"] == "idle" else None

        def what() -> str:
            return f"the agent idle in `sleeve ps --json` (last: {last})"

        run = wait_for(idle, 30, what=what)
        assert run["agent_reason"] is None and run["status"] == "running"
        table = sleeve_proc("ps").out.splitlines()
        assert table[0].split()[6:] == ["agent", "project", "reason"], table
        assert column(table, table[1], "agent") == "idle", table
        assert sleeve_proc("stop", "1", "--project", project).code == 0
        (run,) = ps_json(sleeve_proc)
        assert (run["status"], run["agent"], run["agent_reason"]) == ("stopped", None, None)
    finally:
        if waiter is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                waiter.send_signal(signal.SIGKILL)  # --die-with-parent takes the sandbox along


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections (the kernel's backlog) and never answers: a hung sleeve."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def record(home: Path, sc: Sidecar, slot: int, port: int, token: str | None) -> Run:
    """What `sleeve run` writes to state.json for a running sleeve (a bwrap one: its process)."""
    assert sc.proc is not None
    run = Run(new_run_id() + str(slot), "proj_0000abcd", slot, f"{slot:08x}", "bwrap", "shell")
    run.port, run.token, run.status = port, token, RUNNING
    run.pid, run.pid_start = sc.proc.pid, start_time(sc.proc.pid)
    StateStore(home).upsert(run)
    return run


def test_ps_shows_what_a_waiting_agent_waits_for_and_question_marks_for_the_rest_in_time(
    make_sidecar: Callable[..., Sidecar],
    short_tmp: Path,
    home: Path,
    silent_port: int,
    sleeve_proc: Callable[..., Result],
) -> None:
    sc = waiting_sidecar(make_sidecar, short_tmp, LONG + "\x1b[31m\u202e", SIDECAR_TOKEN=TOKEN)
    status = sc.get("/status")[1]["agent"]
    assert status["reason"] and len(status["reason"]) > 60, status
    runs = {
        "waiting": record(home, sc, 1, sc.port, TOKEN),
        "no token": record(home, sc, 2, sc.port, None),
        "silent": record(home, sc, 3, silent_port, "t"),
        "refused": record(home, sc, 4, free_port(), "t"),
    }
    started = time.monotonic()
    shown = {r["id"]: r for r in ps_json(sleeve_proc)}
    took = time.monotonic() - started
    # The silent sleeve costs at most the deadline (all are asked at once), never a hang.
    assert took < DEADLINE + 5, took
    waiting = shown[runs["waiting"].id]
    assert (waiting["agent"], waiting["agent_reason"]) == ("waiting", status["reason"])
    assert "\x1b" not in str(waiting["agent_reason"]) and "\u202e" not in str(waiting)
    assert shown[runs["no token"].id]["agent"] == "?"
    assert (
        shown[runs["no token"].id]["agent_reason"]
        == "/status answered 401 (no token recorded for it)"
    )
    assert shown[runs["silent"].id]["agent"] == "?"
    assert str(shown[runs["silent"].id]["agent_reason"]).startswith("no answer")
    assert shown[runs["refused"].id]["agent"] == "?"
    assert "refused" in str(shown[runs["refused"].id]["agent_reason"])
    assert all(r["status"] == "running" for r in shown.values())

    # The table: the reason cut to the terminal's width (COLUMNS here), never past it.
    table = sleeve_proc("ps", extra_env={"COLUMNS": "160"}).out.splitlines()
    assert table[0].split()[6:] == ["agent", "project", "reason"], table
    row = next(line for line in table if line.startswith(runs["waiting"].id))
    assert column(table, row, "agent") == "waiting" and len(row) == 160 and row.endswith("…"), row
    assert all(len(line) <= 160 for line in table), table
    assert "no answer" in next(line for line in table if line.startswith(runs["silent"].id))
    # Without a terminal or COLUMNS (a pipe): the whole reason.
    piped = sleeve_proc("ps").out
    assert status["reason"] in piped


def test_printable_drops_escapes_and_bidi_controls_and_cuts() -> None:
    assert (
        printable("Bash: \x1b[31mrm\x1b[0m \u202efile\u200b\n  x", 80) == "Bash: [31mrm [0m file x"
    )
    assert printable("abcdef", 4) == "abc…"
