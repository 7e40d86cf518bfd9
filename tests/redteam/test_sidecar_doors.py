"""The red team's ways around the guard in a real sidecar (issue 29): the CLI registry's
variables (LD_PRELOAD) across launches and relaunches, and the API's port in the moment a
supervisor has crashed. Loopback only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from tests.harness import running_sidecar, wait_for, write_cli_config
from tests.proctools import kill_supervisor, restarted


def marks(log: Path) -> list[tuple[int, str]]:
    """The (pid, seccomp mode) of each process that loaded the agent's library."""
    if not log.exists():
        return []
    return [
        (int(pid), mode)
        for pid, mode in (line.split() for line in log.read_text().split("\n") if line)
    ]


def test_the_registrys_loader_variables_reach_only_the_guarded_cli(
    tmp_path: Path, preload: Callable[[Path], Path]
) -> None:
    """Finding 3: the pane's waiter exported the CLI's variables (the registry's `env:`, the
    env file) and then started the broker, outside any filter: a library of the agent's ran
    in it, at the first launch or any relaunch. Now only processes under the guard's filter
    (seccomp mode 2) load it, at the launch and after a resleeve; the CLI still gets them."""
    log = tmp_path / "workspace" / "loaded.log"  # in the workspace: a root CLI writes there
    lib = preload(log)
    seen = tmp_path / "workspace" / "seen"
    script = f'echo "$LD_PRELOAD $MARKED" >> {seen}; exec sleep 600'
    clis = write_cli_config(
        tmp_path / "clis.yaml",
        {
            "marked": {
                "command": ["sh", "-c", script],
                "env": {"LD_PRELOAD": str(lib), "MARKED": "1"},
            }
        },
    )
    extra = {"SIDECAR_CLI_CONFIG": str(clis), "SIDECAR_EGRESS_ALLOW": "none"}
    with running_sidecar(tmp_path, cli="marked", env_extra=extra) as sc:
        sc.start()
        wait_for(lambda: seen.exists(), what="the CLI's first start")
        code, _ = sc.post("/resleeve", {})
        assert code in {200, 202}
        wait_for(lambda: len(seen.read_text().splitlines()) == 2, what="the CLI started again")
        assert seen.read_text().splitlines() == [f"{lib} 1"] * 2
        got = marks(log)
        assert len(got) >= 2 and all(mode == "2" for _, mode in got), got
        assert sc.stop() == 0


def test_the_api_port_is_never_free_while_a_supervisor_restarts(tmp_path: Path) -> None:
    """Finding 5: between a supervisor's crash and the next one's start the port was free; a
    process of the sleeve bound it and read the API token off the requests. Init now holds
    the listening socket and hands it to each supervisor: every bind in that window fails."""
    tries: list[int] = []
    done = threading.Event()

    def squat(port: int) -> None:
        while not done.is_set():
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                except OSError as exc:
                    tries.append(exc.errno or 0)
                else:
                    tries.append(0)

    with running_sidecar(tmp_path) as sc:
        sc.start()
        squatter = threading.Thread(target=squat, args=(sc.port,), daemon=True)
        kill_supervisor(sc)
        squatter.start()
        try:
            restarted(sc, 1)
        finally:
            done.set()
            squatter.join(10)
        assert tries and set(tries) == {errno.EADDRINUSE}, f"{tries.count(0)} binds got the port"
        assert sc.get("/health")[0] == 200
        assert sc.stop() == 0


def test_a_daemon_renaming_everything_it_can_while_resleeves_run_gets_nowhere(
    tmp_path: Path,
) -> None:
    """A CLI forks a daemon and exits; the daemon renames every entry of the workspace and of
    the state dir (where tmux's socket, the env file and the report socket live) 100 times a
    second while five resleeves run. The workspace's entries move; nothing in the state dir
    does (the guard's fence, which the daemon keeps across relaunches); the sidecar serves
    throughout and its tmux socket is the one it made."""
    ws = tmp_path / "workspace"
    ws.mkdir(exist_ok=True)
    (ws / "notes.md").write_text("the agent's own file\n")
    out, stop = ws / "storm.json", ws / "storm.stop"
    state = tmp_path / "state"
    storm = Path(__file__).resolve().parent / "storm.py"
    script = f"[ -e {out} ] || {sys.executable} {storm} {out} {stop} {ws} {state}; exec sleep 600"
    clis = write_cli_config(tmp_path / "clis.yaml", {"storm": {"command": ["sh", "-c", script]}})
    extra = {"SIDECAR_CLI_CONFIG": str(clis), "SIDECAR_EGRESS_ALLOW": "none"}
    daemon: int | None = None
    with running_sidecar(tmp_path, cli="storm", env_extra=extra) as sc:
        try:
            sc.start()
            daemon = wait_for(lambda: out.exists() and json.loads(out.read_text())["pid"])
            socket_inode = (state / "tmux.sock").stat().st_ino
            for n in range(5):
                assert sc.post("/resleeve", {})[0] in {200, 202}
                sc.wait_status(
                    lambda s: s["cli_running"] and not s["resleeving"],
                    f"resleeve {n + 1} done with the CLI running",
                    timeout=15,
                )
                assert sc.get("/health")[0] == 200
            os.kill(daemon, 0)  # it raced every relaunch (ProcessLookupError if it had not)
            stop.touch()
            counts = wait_for(lambda: _settled(out), what="the daemon's last round")
            assert counts[str(ws)]["renamed"] > 0  # it did run, and could move its own files
            assert counts[str(state)] == {"renamed": 0, "refused": counts[str(state)]["refused"]}
            assert counts[str(state)]["refused"] > 0
            assert (state / "tmux.sock").stat().st_ino == socket_inode
            assert sc.stop() == 0
        finally:
            if daemon:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon, signal.SIGKILL)


def _settled(out: Path) -> dict[str, dict[str, int]] | None:
    """The daemon's counts once its process is gone."""
    data = json.loads(out.read_text())
    try:
        os.kill(data["pid"], 0)
    except ProcessLookupError:
        return data["counts"]  # type: ignore[no-any-return]
    return None
