"""The supervisor with real tmux, real ttyd and real CLI processes, driven through its HTTP API."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.agenttools import EventLog, wait_ticks
from tests.harness import (
    Sidecar,
    http,
    py_cli,
    stubborn_pids,
    stubborn_starts,
    wait_for,
    write_cli_config,
)
from tests.proctools import all_exited, terminal_clients


def read_pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_start_serves_health_status_and_terminal_with_the_shell_cli(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(
        cli="shell", env_extra={"SLEEVE_GOAL": "Write the parser", "SLEEVE_REPO": "acme/app"}
    ).start()
    code, health = sc.get("/health")
    assert code == 200
    assert health["status"] == "healthy"
    assert isinstance(health["uptime"], int)
    status = sc.status()
    assert status["sleeve_id"] == "test-sleeve"
    assert status["status"] == "working"
    assert status["current_task"] == "Write the parser"
    assert status["cli"] == "shell"
    assert status["repo"] == "acme/app"
    assert psutil.Process(status["cli_pid"]).name() == "bash"
    assert status["last_activity"].endswith("Z")
    assert status["warnings"] == []
    # ttyd is reachable only through the proxy: by default on a unix socket in the 0700 state
    # dir, with no TCP listener and no credential in its argv.
    assert sc.proc is not None
    ttyd = next(
        p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ttyd"
    )
    assert ttyd.net_connections("tcp") == []
    assert "--credential" not in ttyd.cmdline()
    assert (sc.state_dir / "ttyd.sock").is_socket()
    resp = http("GET", sc.url + "/terminal/")
    assert resp.status == 200
    assert b"<html" in resp.body[:4096].lower() or resp.headers.get("Content-Encoding") == "gzip"


def test_tmux_session_has_the_contract_options_and_socket_in_state_dir(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    sock = sc.state_dir / "tmux.sock"
    assert sock.is_socket()
    assert (sc.state_dir.stat().st_mode & 0o777) == 0o700

    def show(*args: str) -> str:
        import subprocess

        out = subprocess.run(
            ["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    assert (
        show(
            "display-message",
            "-p",
            "-t",
            "main",
            "#{session_name} #{window_width}x#{window_height}",
        )
        == "main 200x50"
    )
    assert show("show-options", "-gv", "mouse") == "off"
    assert show("show-options", "-gv", "history-limit") == "50000"
    assert show("show-options", "-gv", "remain-on-exit") == "on"
    assert show("show-options", "-gv", "window-size") == "manual"


def test_resleeve_kills_a_tree_that_ignores_sighup_and_sigterm(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pids_file = short_tmp / "stubborn.pids"
    config = write_cli_config(
        short_tmp / "clis.yaml",
        {
            "stubborn": py_cli("stubborn.py", str(pids_file)),
            "pidfile": py_cli("pidfile.py", str(short_tmp / "new.pid")),
        },
    )
    sc = make_sidecar(
        cli="stubborn", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_STOP_GRACE": "1"}
    ).start()
    old = wait_for(lambda: stubborn_pids(pids_file), what="stubborn CLI ready")
    assert sc.status()["cli_pid"] == old[0]

    code, body = sc.post("/resleeve", {"cli": "pidfile"})
    assert code == 202
    assert body == {"status": "resleeving", "cli": "pidfile"}
    status = sc.wait_status(
        lambda s: s["cli"] == "pidfile" and s["cli_running"] and not s["resleeving"], "new CLI up"
    )
    assert wait_for(lambda: all_exited(old), what="old tree gone")
    new_pid = int(wait_for(lambda: (short_tmp / "new.pid").read_text(), what="new CLI pid file"))
    assert status["cli_pid"] == new_pid
    assert new_pid not in old
    assert "SIGKILL to 2 processes" in sc.log()


def test_resleeve_of_a_polite_cli_restarts_it_in_place_and_keeps_the_workspace(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pid_file = short_tmp / "cli.pid"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"pidfile": py_cli("pidfile.py", str(pid_file))}
    )
    sc = make_sidecar(
        cli="pidfile", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SLEEVE_GOAL": "keep me"}
    ).start()
    first = int(wait_for(lambda: pid_file.read_text(), what="first pid"))
    pid_file.unlink()
    assert sc.post("/resleeve")[0] == 202
    second = int(wait_for(lambda: pid_file.read_text(), what="second pid"))
    assert second != first
    assert wait_for(lambda: all_exited([first]), what="first CLI gone")
    assert sc.status()["current_task"] == "keep me"
    assert "SIGKILL" not in sc.log()


def test_kill_9_of_the_tmux_server_heals_session_and_cli(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    before = sc.status()["cli_pid"]
    server = next(p for p in psutil.Process(before).parents() if p.name().startswith("tmux"))
    server.kill()
    status = sc.wait_status(
        lambda s: s["cli_running"] and s["cli_pid"] != before,
        "CLI back after tmux death",
        timeout=5,
    )
    assert server.pid not in [p.pid for p in psutil.Process(status["cli_pid"]).parents()]
    assert sc.get("/health")[1]["status"] == "healthy"
    assert wait_for(lambda: all_exited([before]), what="old shell gone")


def test_kill_9_of_ttyd_brings_it_back(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    [ttyd] = [p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ttyd"]  # type: ignore[union-attr]
    ttyd.kill()

    def new_ttyd() -> bool:
        procs = [
            p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ttyd"
        ]  # type: ignore[union-attr]
        return bool(procs) and procs[0].pid != ttyd.pid and sc.status()["ttyd_state"] == "running"

    wait_for(new_ttyd, timeout=5, what="ttyd restarted")
    # asyncio saw ttyd's real status (-9: SIGKILL), not one stolen by a reaper (255).
    assert "ttyd: was killed (SIGKILL)" in sc.log()
    assert sc.get("/terminal/")[0] == 200


def test_on_failure_restarts_with_growing_backoff(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    starts = short_tmp / "starts"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"failing": py_cli("exit_with.py", "3", str(starts))}
    )
    sc = make_sidecar(
        cli="failing",
        env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_RESTART": "on-failure"},
    )
    sc.start(wait_healthy=False)
    stamps: list[float] = []

    def four_starts() -> bool:
        lines = starts.read_text().split() if starts.exists() else []
        while len(stamps) < len(lines):
            stamps.append(time.monotonic())
        return len(lines) >= 4

    wait_for(four_starts, timeout=20, interval=0.01, what="four starts")
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    # 1 s, 2 s, 4 s: each wait at least the backoff, each longer than the last.
    assert gaps[0] >= 0.9
    assert gaps[1] > gaps[0] + 0.5
    assert gaps[2] > gaps[1] + 1.0
    # After the fourth exit the wait is 8 s: status shows that failure all along it (the third
    # wait, 4 s, may still be under way when the fourth start's line appears).
    status = sc.wait_status(
        lambda s: s["cli_state"] == "backoff" and "CLI: restarting in 8s" in s["warnings"],
        "the backoff after the fourth exit",
    )
    assert status["cli_exit_code"] == 3
    assert status["cli_running"] is False and status["cli_pid"] is None
    assert status["health"] == "degraded"


def test_restart_no_leaves_the_sleeve_degraded_with_the_exit_code(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    config = write_cli_config(short_tmp / "clis.yaml", {"once": py_cli("exit_with.py", "7")})
    sc = make_sidecar(cli="once", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start(
        wait_healthy=False
    )
    status = sc.wait_status(lambda s: s["cli_state"] == "exited", "CLI exited")
    assert status["cli_exit_code"] == 7, sc.log()
    assert status["cli_running"] is False
    assert status["health"] == "degraded"
    assert sc.get("/health") == (
        200,
        {"status": "degraded", "uptime": sc.get("/health")[1]["uptime"], "agent": "exited"},
    )


def test_missing_cli_binary_is_fatal_but_the_sidecar_keeps_serving(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    config = write_cli_config(
        short_tmp / "clis.yaml", {"ghost": {"command": ["no-such-cli-binary", "--flag"]}}
    )
    sc = make_sidecar(cli="ghost", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start(
        wait_healthy=False
    )
    status = sc.wait_status(lambda s: s["cli_state"] == "fatal", "FATAL state")
    assert status["health"] == "degraded"
    assert any("no-such-cli-binary" in w and "not found" in w for w in status["warnings"])
    assert sc.get("/health")[1]["status"] == "degraded"
    # A resleeve to an installed CLI recovers it.
    assert sc.post("/resleeve", {"cli": "shell"})[0] == 202
    sc.wait_status(lambda s: s["cli_running"] and s["cli"] == "shell", "recovered by resleeve")


def test_sigterm_stops_everything_marks_killed_and_exits_0(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pids_file = short_tmp / "stubborn.pids"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"stubborn": py_cli("stubborn.py", str(pids_file))}
    )
    sc = make_sidecar(
        cli="stubborn",
        env_extra={
            "SIDECAR_CLI_CONFIG": str(config),
            "SLEEVE_GOAL": "x",
            "SIDECAR_STOP_GRACE": "1",
        },
    )
    sc.start()
    cli_pids = wait_for(lambda: stubborn_pids(pids_file), what="CLI ready")
    assert sc.proc is not None
    ours = [p.pid for p in psutil.Process(sc.proc.pid).children(recursive=True)]
    started = time.monotonic()
    assert sc.stop() == 0
    assert time.monotonic() - started < 1 + 1.5
    assert wait_for(lambda: all_exited(ours + cli_pids), timeout=3, what="nothing of ours left")
    text = (sc.workspace / ".cstack" / "CURRENT.md").read_text()
    assert "## Status\nkilled" in text
    assert not (sc.state_dir / "tmux.sock").exists()


def next_event(stream: Any) -> dict[str, Any]:
    """The next line that is not an agent-state event (the shell's own, at any moment)."""
    while True:
        event = dict(json.loads(stream.readline()))
        if event["type"] != "agent-state":
            return event


def test_events_stream_reports_progress_within_a_second_of_an_edit(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(env_extra={"SLEEVE_GOAL": "stream me"}).start()
    current = sc.workspace / ".cstack" / "CURRENT.md"
    with urllib.request.urlopen(sc.url + "/events", timeout=10) as stream:
        assert json.loads(stream.readline())["type"] == "heartbeat"  # subscribed
        edited = time.monotonic()
        current.write_text(
            current.read_text().replace("## Progress\n", "## Progress\n- [x] one\n- [ ] two\n")
        )
        event = next_event(stream)
        elapsed = time.monotonic() - edited
        assert event["type"] == "progress-update"
        assert event["progress"] == {"total": 2, "completed": 1}
        assert elapsed < 1.5
        current.write_text(current.read_text().replace("## Status\nworking", "## Status\ndone"))
        kinds = {next_event(stream)["type"], next_event(stream)["type"]}
        assert kinds == {"progress-update", "completion"}


def test_status_survives_hostile_current_md(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    current = sc.workspace / ".cstack" / "CURRENT.md"
    assert sc.status()["status"] == "unknown"  # missing file
    current.parent.mkdir(exist_ok=True)
    cases: dict[str, bytes] = {
        "empty": b"",
        "binary": os.urandom(4096) + b"\x00\x00",
        "bad utf-8": b"## Status\nworking\n## Task\n\xff\xfe broken \xc3\x28\n",
        "duplicated": b"## Status\nblocked\n## Status\ndone\n## Blockers\n- CI is red\n",
    }
    for name, data in cases.items():
        current.write_bytes(data)
        code, body = sc.get("/status")
        assert code == 200, name
        assert body["status"] in ("unknown", "blocked", "working"), name
    assert body["blockers"] == ["CI is red"]
    assert body["warnings"]
    # 50 MB: answered quickly from a bounded read.
    with current.open("wb") as fh:
        fh.write(b"## Status\nworking\n## Progress\n")
        fh.write(b"- [x] item\n" * (50 * 1024 * 1024 // 11))
    code, body = sc.get("/status")
    assert code == 200
    assert body["status"] == "working"
    assert any("MiB" in w or "bytes" in w or "large" in w for w in body["warnings"])


def test_missing_workspace_is_created(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar()
    assert not sc.workspace.exists()
    sc.start()
    assert sc.workspace.is_dir()


@pytest.mark.needs("unshare")
def test_read_only_workspace_is_served_with_a_warning(make_sidecar: Callable[..., Sidecar]) -> None:
    """Root ignores permission bits, so the workspace is made read-only with a read-only bind
    mount in a private mount namespace (the OS seam: no other way to deny root a write)."""
    sc = make_sidecar(env_extra={"SLEEVE_GOAL": "cannot write"})
    sc.workspace.mkdir()
    ws = str(sc.workspace)
    sc.wrapper = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount --bind -o ro "$0" "$0" && exec "$@"',
        ws,
    ]
    sc.start()
    warnings = sc.status()["warnings"]
    assert any("read-only" in w for w in warnings), warnings
    assert any("SLEEVE_GOAL" in w for w in warnings), warnings
    assert sc.get("/health")[1]["status"] == "healthy"


def test_cli_gets_its_env_but_never_the_api_tokens(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    out = short_tmp / "env.json"
    script = (
        "import json,os,sys,signal\n"
        "with open(sys.argv[1], 'w') as f: json.dump(dict(os.environ), f)\n"
        "signal.pause()"
    )
    config = write_cli_config(
        short_tmp / "clis.yaml",
        {
            "envdump": {
                "command": [sys.executable, "-c", script, str(out)],
                "env": {"EXTRA_FLAG": "1"},
            }
        },
    )
    sc = make_sidecar(
        cli="envdump",
        env_extra={
            "SIDECAR_CLI_CONFIG": str(config),
            "SIDECAR_TOKEN": "s3cret-token",
            "SIDECAR_VIEW_TOKEN": "v1ew-token",
        },
    )
    sc.start(wait_healthy=False)
    env = wait_for(
        lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()), what="env dump"
    )
    assert env["EXTRA_FLAG"] == "1"
    assert "SIDECAR_TOKEN" not in env
    assert "SIDECAR_VIEW_TOKEN" not in env
    assert env["TERM"].startswith("tmux")


def test_sigint_is_a_graceful_stop_too(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    assert sc.proc is not None
    sc.proc.send_signal(signal.SIGINT)
    assert sc.proc.wait(10) == 0


# ---- self-healing, restart policies and /status cost ----------------------------------------


def tmux_on(sock: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-S", str(sock), *args], capture_output=True, text=True, check=False
    )


async def terminal_shows(sc: Sidecar, needle: str, timeout: float = 10.0) -> None:
    """A ttyd-protocol WebSocket through /terminal/ws (ttyd runs a new `tmux attach` for it)
    receives `needle` from the pane, while a tmux client is attached on the sidecar's socket."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(sc.url + "/terminal/ws", protocols=("tty",)) as ws,
    ):
        await ws.send_str(json.dumps({"AuthToken": "", "columns": 120, "rows": 40}))
        output = b""
        deadline = time.monotonic() + timeout
        while needle.encode() not in output:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{needle!r} not seen; got {output[-500:]!r}"
            msg = await ws.receive(timeout=remaining)
            assert msg.type is aiohttp.WSMsgType.BINARY, msg
            if msg.data[:1] == b"0":
                output += msg.data[1:]
        assert terminal_clients(sc), "no tmux client attached"


async def test_kill_9_of_the_tmux_server_heals_within_2s_with_the_resume_argv(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The bound is the issue's: 2 s from the kill until a new CLI runs in a new session and
    /health says healthy. The CLI ignores SIGHUP and SIGTERM (as does its child), so it would
    outlive its tmux server as an orphan unless the sidecar stops it; the grace is 1 s."""
    record = short_tmp / "starts.jsonl"
    command = py_cli("stubborn.py", str(record), "fresh")["command"]
    resume = [*command[:-1], "resumed"]
    config = write_cli_config(
        short_tmp / "clis.yaml", {"stubborn": {"command": command, "resume": resume}}
    )
    sc = make_sidecar(
        cli="stubborn", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_STOP_GRACE": "1"}
    ).start()
    [first] = wait_for(lambda: stubborn_starts(record), what="first CLI recorded")
    assert first["argv"] == command[1:]  # a first start does not resume (README)
    old = [first["pid"], first["child"]]
    assert sc.status()["cli_pid"] == first["pid"]
    server = next(p for p in psutil.Process(first["pid"]).parents() if p.name().startswith("tmux"))

    killed = time.monotonic()
    server.kill()
    status = sc.wait_status(
        lambda s: s["cli_running"] and s["cli_pid"] not in old and s["health"] == "healthy",
        "a new CLI running after the tmux server's death",
        timeout=15,  # generous only so that a slow heal fails on the bound below, with numbers
    )
    healed = time.monotonic() - killed
    assert healed <= 2.0, f"healthy again {healed:.2f}s after the kill"
    # (a) The old CLI and its child were stopped before the new session started.
    assert all_exited(old), [psutil.Process(p).status() for p in old if psutil.pid_exists(p)]
    # (b) The new CLI was started with the resume argv.
    second = wait_for(lambda: stubborn_starts(record)[1:], what="second CLI recorded")[0]
    assert second["pid"] == status["cli_pid"]
    assert second["argv"] == resume[1:]
    assert server.pid not in [p.pid for p in psutil.Process(second["pid"]).parents()]
    assert sc.get("/health")[1]["status"] == "healthy"
    # (c) The web terminal shows the new session.
    await terminal_shows(sc, f"stubborn {second['pid']} ready")


def attach_shows(sc: Sidecar, needle: str, timeout: float = 10.0) -> None:
    """`sidecar attach` on a real pty shows `needle` from the pane, as a tmux client."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    env = {k: v for k, v in sc.env().items() if k != "TMUX"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "attach"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(slave)
    os.set_blocking(master, False)
    seen = bytearray()

    def shows() -> bool:
        with contextlib.suppress(BlockingIOError):
            seen.extend(os.read(master, 65536))
        return needle.encode() in seen and proc.poll() is None

    try:
        wait_for(shows, timeout=timeout, what=f"{needle!r} through `sidecar attach`")
        assert terminal_clients(sc), "no tmux client attached"
    finally:
        proc.kill()
        proc.wait(5)
        os.close(master)


def test_a_deleted_tmux_socket_is_recreated_within_2s_and_attach_works_again(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """Agents run `rm -rf /tmp/*`; here the socket lives in the state dir, and whoever deletes
    it cuts `sidecar attach` and ttyd off a server that still runs. tmux recreates its socket
    on SIGUSR1 and nothing else makes it come back, so its return is the sidecar's doing; the
    same server and CLI keep running (no heal, no restart)."""
    pid_file = short_tmp / "cli.pid"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"pidfile": py_cli("pidfile.py", str(pid_file))}
    )
    sc = make_sidecar(cli="pidfile", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start()
    cli_pid = int(wait_for(lambda: pid_file.read_text(), what="CLI pid"))
    server = next(p for p in psutil.Process(cli_pid).parents() if p.name().startswith("tmux"))
    sock = sc.state_dir / "tmux.sock"
    assert tmux_on(sock, "has-session", "-t", "main").returncode == 0

    sock.unlink()
    deleted = time.monotonic()
    assert tmux_on(sock, "has-session", "-t", "main").returncode != 0  # really cut off
    wait_for(
        lambda: sock.is_socket() and tmux_on(sock, "has-session", "-t", "main").returncode == 0,
        timeout=10,
        what="tmux answering on a recreated socket",
    )
    back = time.monotonic() - deleted
    assert back <= 2.0, f"socket back {back:.2f}s after it was deleted"
    assert "vanished" in sc.log()
    assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE
    assert sc.status()["cli_pid"] == cli_pid
    attach_shows(sc, "pidfile ready")


def test_restart_always_restarts_a_cli_that_exits_0(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    starts = short_tmp / "starts"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"ok": py_cli("exit_with.py", "0", str(starts))}
    )
    sc = make_sidecar(
        cli="ok", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_RESTART": "always"}
    ).start(wait_healthy=False)
    pids = wait_for(
        lambda: len(read_pids(starts)) >= 3 and read_pids(starts), timeout=15, what="3 starts"
    )
    assert len(set(pids)) == len(pids)
    assert "exited with 0" in sc.log()


def test_restart_on_failure_leaves_a_cli_that_exits_0_stopped(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The first restart would come 1 s after the exit (the backoff). Three ticks of the
    supervisor's once-a-second loop, seen on /events after the exit, are past that moment on
    the supervisor's own clock: no second start by then (and a state still `exited`) means
    none is coming."""
    starts = short_tmp / "starts"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"ok": py_cli("exit_with.py", "0", str(starts))}
    )
    sc = make_sidecar(
        cli="ok", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_RESTART": "on-failure"}
    ).start(wait_healthy=False)
    events = EventLog(sc)
    status = sc.wait_status(lambda s: s["cli_state"] == "exited", "CLI exited")
    assert status["cli_exit_code"] == 0
    assert status["cli_running"] is False
    assert status["health"] == "degraded"
    assert sc.get("/health")[1]["status"] == "degraded"
    wait_ticks(sc, events, 3)
    assert sc.status()["cli_state"] == "exited", (
        "a CLI that exited 0 was restarted under on-failure"
    )
    assert len(read_pids(starts)) == 1


STRACE = ["strace", "-f", "-qq", "-e", "trace=clone,clone3,fork,vfork", "-e", "signal=none"]
FORK = re.compile(r"\b(clone3?|v?fork)\(")


@pytest.mark.needs("strace")
def test_status_never_forks(make_sidecar: Callable[..., Sidecar], short_tmp: Path) -> None:
    """Witness: strace attached to every thread of the supervisor, tracing the system calls
    that make a process (clone/clone3 without CLONE_THREAD, fork, vfork), while /status is
    asked 200 times. A /status that ran tmux (libtmux forks a client per call, from a worker
    thread) would show up there: the positive control below is a resleeve, whose tmux calls
    the same trace does see. The supervisor's children (psutil) are the same before and after
    too. (A machine-wide pid count is no witness: other work forks meanwhile.)"""
    sc = make_sidecar().start()
    assert sc.proc is not None
    [supervisor] = [
        p
        for p in psutil.Process(sc.proc.pid).children()
        if "-m sidecar run" in " ".join(p.cmdline())
    ]

    def traced(action: Callable[[], None], name: str) -> list[str]:
        out = short_tmp / f"{name}.strace"
        tracer = subprocess.Popen(
            [*STRACE, "-o", str(out), "-p", str(supervisor.pid)], stderr=subprocess.DEVNULL
        )
        try:

            def all_threads_traced() -> bool:
                tasks = list(Path(f"/proc/{supervisor.pid}/task").iterdir())
                return all(
                    f"TracerPid:\t{tracer.pid}\n" in (t / "status").read_text() for t in tasks
                )

            wait_for(all_threads_traced, what="strace attached to every supervisor thread")
            action()
        finally:
            tracer.send_signal(signal.SIGINT)  # detaches
            tracer.wait(10)
        return [line for line in out.read_text().splitlines() if FORK.search(line)]

    def control_client() -> bool:  # the activity source's `tmux -C attach` (sidecar.pane.control)
        return any("-C" in p.cmdline() for p in supervisor.children())

    wait_for(control_client, what="the activity client attached")
    before = {p.pid for p in supervisor.children(recursive=True)}

    def poll_status() -> None:
        for _ in range(200):
            assert sc.status()["cli_running"]

    calls = traced(poll_status, "status")
    assert {p.pid for p in supervisor.children(recursive=True)} == before
    forks = [line for line in calls if "CLONE_THREAD" not in line]
    assert forks == [], forks

    def resleeve() -> None:
        assert sc.post("/resleeve")[0] == 202
        sc.wait_status(lambda s: s["cli_running"] and not s["resleeving"], "resleeve done")

    control = [line for line in traced(resleeve, "resleeve") if "CLONE_THREAD" not in line]
    assert control, "the witness saw no fork even when tmux ran"


def test_the_cli_runs_under_a_c_locale(make_sidecar: Callable[..., Sidecar]) -> None:
    """LC_ALL=C (a user's shell outside the image): tmux then takes its clients for non-UTF-8
    and prints the pane's fields with a tab as "_"; the sidecar must still read them."""
    sc = make_sidecar(env_extra={"LC_ALL": "C", "LANG": "C"}).start()
    status = sc.status()
    assert status["cli_state"] == "running", status
    assert psutil.pid_exists(status["cli_pid"])
    assert "cannot start the CLI" not in sc.log()
