"""PID-1 behaviour in a real PID namespace (`unshare --pid --fork --mount-proc`): the sidecar is
PID 1 there, reaps orphans, keeps exit statuses exact, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.harness import Sidecar, py_cli, wait_for, write_cli_config

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def namespace_init(sc: Sidecar) -> psutil.Process:
    """The sidecar process that is PID 1 inside the namespace (unshare's only child)."""
    assert sc.proc is not None
    [child] = psutil.Process(sc.proc.pid).children()
    return child


def ns_pid(proc: psutil.Process) -> int:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    msg = "no NSpid line"
    raise AssertionError(msg)


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
    status = sc.wait_status(lambda s: s["cli_state"] == "exited", "CLI exited")
    assert status["cli_exit_code"] == 7
    # ttyd is an asyncio child: its death by SIGKILL must read as -9, not 255.
    init = namespace_init(sc)
    [ttyd] = [p for p in init.children(recursive=True) if p.name() == "ttyd"]
    ttyd.kill()
    wait_for(lambda: "ttyd exited with -9" in sc.log(), timeout=5, what="ttyd's exit status")
    sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd back")
    # libtmux's subprocess calls still see real statuses: a resleeve works end to end.
    assert sc.post("/resleeve", {"cli": "shell"})[0] == 202
    sc.wait_status(lambda s: s["cli"] == "shell" and s["cli_running"], "shell running")
    assert "unknown child process" not in sc.log().lower()


def test_sigterm_empties_the_namespace_within_grace(
    in_namespace: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pids = short_tmp / "stubborn.pids"
    sc = in_namespace(
        "stubborn", {"stubborn": py_cli("stubborn.py", str(pids))}, SIDECAR_STOP_GRACE="2"
    ).start()
    wait_for(pids.exists, what="stubborn CLI ready")
    init = namespace_init(sc)
    members = [init, *init.children(recursive=True)]
    assert len(members) >= 5  # init, supervisor, tmux, ttyd, waiter, CLI, its child
    started = time.monotonic()
    init.send_signal(signal.SIGTERM)
    assert sc.proc is not None
    assert sc.proc.wait(10) == 0
    assert time.monotonic() - started <= 2 + 1
    assert not [p for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
