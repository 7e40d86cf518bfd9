"""`GET /screen`: the CLI pane's screen as a person attached sees it, asked of tmux through the
sidecar's control client. Real sidecars, real tmux, the CLIs of tests/clis/screen_cli.py: what a
CLI drew, wide and combining characters, an exited CLI, tmux stopped and killed under it, the
control client detached at the terminal, and proof that a look starts no process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from sidecar.agent.registry import load_registry
from sidecar.api.app import create_app
from sidecar.config import Config
from sidecar.core.events import EventBus
from sidecar.process.supervisor import Supervisor
from tests.clis.screen_cli import ROWS, wide_line
from tests.faulttools import only_server
from tests.harness import CLIS, Sidecar, wait_for, write_cli_config

TOKEN = "screen-admin-token-0123"
VIEW = "screen-view-token-0123"
MARKER = "SCREEN-MARKER-7f3a"
LOOK_FAILED = "cannot look at the CLI's screen"


def screen_cli(tmp: Path, mode: str, **extra: str) -> Sidecar:
    config = write_cli_config(
        tmp / "clis.yaml",
        {"drawer": {"command": [sys.executable, str(CLIS / "screen_cli.py"), mode, MARKER]}},
    )
    env = {"SIDECAR_CLI_CONFIG": str(config), **extra}
    return Sidecar(tmp, cli="drawer", env_extra=env)


@pytest.fixture
def drawer(short_tmp: Path) -> Iterator[Callable[..., Sidecar]]:
    made: list[Sidecar] = []

    def make(mode: str = "marker", **extra: str) -> Sidecar:
        sub = short_tmp / f"s{len(made)}"
        sub.mkdir()
        sc = screen_cli(sub, mode, **extra)
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.kill_everything()


def drawn(sc: Sidecar, text: str, **kw: Any) -> dict[str, Any]:
    """The first /screen answer with `text` on a line."""

    def look() -> dict[str, Any] | None:
        code, body = sc.get("/screen", **kw)
        assert code == 200, body
        return body if any(text in line for line in body["lines"]) else None

    return wait_for(look, what=f"{text!r} on /screen")


def test_screen_shows_what_the_cli_drew_with_cursor_and_size(
    drawer: Callable[..., Sidecar],
) -> None:
    sc = drawer().start()
    screen = drawn(sc, MARKER)
    assert (screen["rows"], screen["cols"]) == (50, 200)
    assert len(screen["lines"]) == 50
    assert screen["lines"][:3] == ["", MARKER, "ready>"]  # trailing spaces trimmed
    assert screen["lines"][3:] == [""] * 47
    assert screen["cursor"] == {"row": 2, "col": len("ready> ")}


def test_view_token_may_look_and_no_token_may_not(drawer: Callable[..., Sidecar]) -> None:
    sc = drawer(SIDECAR_TOKEN=TOKEN, SIDECAR_VIEW_TOKEN=VIEW).start()
    viewer = {"Authorization": f"Bearer {VIEW}"}
    assert drawn(sc, MARKER, headers=viewer)["rows"] == 50
    code, body = sc.get("/screen", headers={})
    assert code == 401, body
    assert sc.get("/screen", headers={"Authorization": "Bearer nope"})[0] == 401


def test_fifty_lines_of_wide_and_combining_characters(drawer: Callable[..., Sidecar]) -> None:
    sc = drawer("wide").start()
    screen = drawn(sc, wide_line(ROWS - 1))
    assert screen["lines"] == [wide_line(row) for row in range(ROWS)]
    assert screen["cursor"] == {"row": 3, "col": 10}


def test_an_exited_cli_shows_the_screen_tmux_kept(drawer: Callable[..., Sidecar]) -> None:
    """remain-on-exit keeps the dead pane, and with it what the CLI left on screen."""
    sc = drawer("exit").start(wait_healthy=False)
    sc.wait_status(lambda s: s["cli_state"] == "exited", "the CLI exited")
    screen = drawn(sc, MARKER)
    assert screen["rows"] == 50
    assert "ready>" in screen["lines"]


def test_a_stopped_tmux_is_503_logged_once_and_the_next_look_is_right(
    drawer: Callable[..., Sidecar],
) -> None:
    """tmux stopped (SIGSTOP) answers nothing: each look gives up after 1 s with a 503, one log
    line for the whole run. Once tmux runs again it answers the looks that gave up first: the
    next look still gets its own answer."""
    sc = drawer().start()
    drawn(sc, MARKER)
    server = only_server(sc)
    os.kill(server, signal.SIGSTOP)
    try:
        for _ in range(3):
            code, body = sc.get("/screen")
            assert code == 503, body
            assert "did not answer within 1 s" in body["error"]
    finally:
        os.kill(server, signal.SIGCONT)
    assert drawn(sc, MARKER)["cursor"] == {"row": 2, "col": 7}
    wait_for(lambda: "works again" in sc.log(), what="the recovery logged")
    assert sc.log().count(LOOK_FAILED) == 1


def test_screen_right_after_tmux_is_killed_is_503_or_the_healed_screen(
    drawer: Callable[..., Sidecar],
) -> None:
    sc = drawer().start()
    first = sc.status()["cli_pid"]
    drawn(sc, MARKER)
    os.kill(only_server(sc), signal.SIGKILL)
    codes = set()

    def healed() -> bool:
        code, body = sc.get("/screen")
        codes.add(code)
        return code == 200 and MARKER in body["lines"] and sc.status()["cli_pid"] != first

    wait_for(healed, timeout=20, what="the healed CLI's screen")
    assert codes <= {200, 503}, codes


@pytest.mark.needs("strace")
def test_a_look_starts_no_process(drawer: Callable[..., Sidecar], short_tmp: Path) -> None:
    """strace follows every process of the sleeve from its start (init, supervisor, tmux, ttyd,
    the CLI): 20 looks make no fork, vfork, process clone or execve anywhere in it."""
    trace = short_tmp / "strace.log"
    sc = drawer()
    sc.wrapper = ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=process"]
    sc.start()
    drawn(sc, MARKER)
    before = spawns(trace)
    for _ in range(20):
        code, body = sc.get("/screen")
        assert code == 200, body
        assert MARKER in body["lines"]
    assert spawns(trace) == before
    # The trace did follow the sleeve: it saw the supervisor start its control client.
    assert [line for line in before if '"-C", "attach-session"' in line], before
    assert not [line for line in before if "capture-pane" in line]


async def test_no_pane_and_none_coming_is_409(short_tmp: Path) -> None:
    """A supervisor that has started nothing (the state before the first launch and after
    shutdown): no pane, no control client, the CLI stopped."""
    config = Config(sleeve_name="s", cli="shell", workspace=short_tmp, state_dir=short_tmp)
    app = create_app(Supervisor(config, load_registry(None), EventBus()))
    async with TestClient(TestServer(app, host="127.0.0.1", port=0)) as client:
        response = await client.get("/screen")
        assert response.status == 409
        body = await response.json()
        assert body == {"error": "no screen: the CLI is stopped and tmux has no pane of it"}


SPAWN = re.compile(r"^\d+\s+(?:execve|fork|vfork|clone3?)\(")


def spawns(trace: Path) -> list[str]:
    """The calls in the trace that start a process (a clone without CLONE_THREAD) or a program."""
    lines = trace.read_text(errors="replace").splitlines()
    return [line for line in lines if SPAWN.match(line) and "CLONE_THREAD" not in line]


def test_the_clis_pane_is_reached_by_its_id_after_someone_swaps_panes(
    drawer: Callable[..., Sidecar],
) -> None:
    """Someone at the terminal splits the window and swaps the two panes (tmux's own keys do
    that): `main:0.0` is now the other pane, and /screen and POST /input still reach the CLI,
    whose pane the sidecar names by its id."""
    sc = drawer().start()
    drawn(sc, MARKER)
    tmux = ["tmux", "-S", str(sc.state_dir / "tmux.sock")]
    other = "sh -c 'echo OTHER-PANE; exec sleep 600'"
    subprocess.run([*tmux, "split-window", "-h", "-t", "main", other], check=True)
    subprocess.run([*tmux, "swap-pane", "-s", "%0", "-t", "%1"], check=True)
    where = [*tmux, "display-message", "-p", "-t", "main:0.0", "#{pane_id}"]
    assert subprocess.run(where, capture_output=True, text=True, check=True).stdout == "%1\n"
    assert sc.post("/input", {"text": "typed-after-the-swap"})[0] == 202
    screen = drawn(sc, "ready> typed-after-the-swap")
    assert MARKER in screen["lines"] and not any("OTHER-PANE" in line for line in screen["lines"])


def control_clients(sc: Sidecar) -> set[int]:
    """The pids of the tmux control-mode clients on the sidecar's server (the sidecar's own)."""
    argv = ["tmux", "-S", str(sc.state_dir / "tmux.sock"), "list-clients", "-F"]
    listed = subprocess.run(
        [*argv, "#{client_control_mode} #{client_pid}"], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return {int(line.split()[1]) for line in listed if line.startswith("1 ")}


def test_a_control_client_detached_at_the_terminal_is_attached_again(
    drawer: Callable[..., Sidecar],
) -> None:
    """`tmux detach-client -s main`, typed at the terminal (or by the agent), detaches every
    client of the session, the sidecar's control client too: it is attached again, /screen
    answers within seconds (503 meanwhile, never a 500) and input reaches the CLI, which was
    not restarted."""
    sc = drawer().start()
    drawn(sc, MARKER)
    first, pid = control_clients(sc), sc.status()["cli_pid"]
    assert len(first) == 1, first
    tmux = ["tmux", "-S", str(sc.state_dir / "tmux.sock")]
    subprocess.run([*tmux, "detach-client", "-s", "main"], check=True)
    codes = set()

    def back() -> bool:
        code, body = sc.get("/screen")
        codes.add(code)
        return code == 200 and MARKER in body["lines"] and bool(control_clients(sc) - first)

    wait_for(back, timeout=5, what="/screen through a new control client")
    assert codes <= {200, 503}, codes
    assert not control_clients(sc) & first  # the detached one is gone
    assert sc.post("/input", {"text": "typed-after-the-detach"})[0] == 202
    assert MARKER in drawn(sc, "ready> typed-after-the-detach")["lines"]
    assert sc.status()["cli_pid"] == pid
