"""The sleeve's processes as the crash, PID-1 and supervisor tests see them: init (the process a
test started, or PID 1 of a namespace), the supervisor it forks, tmux on the sleeve's socket,
and the three ways a test asks whether processes are gone."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psutil

from tests.harness import Sidecar

# A sidecar as PID 1 of a fresh PID namespace: the `wrapper` of a `Sidecar`.
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def namespace_init(sc: Sidecar) -> psutil.Process:
    """The sidecar process that is PID 1 inside the namespace (unshare's only child)."""
    assert sc.proc is not None
    [child] = psutil.Process(sc.proc.pid).children()
    return child


def ns_pid(proc: psutil.Process) -> int:
    """`proc`'s pid as its own PID namespace sees it (the last field of NSpid)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    msg = "no NSpid line"
    raise AssertionError(msg)


def init_of(sc: Sidecar) -> psutil.Process:
    """The sidecar's init: the process the test started, or PID 1 of its namespace."""
    assert sc.proc is not None
    return namespace_init(sc) if sc.wrapper else psutil.Process(sc.proc.pid)


def supervisor_of(init: psutil.Process) -> psutil.Process | None:
    """The running supervisor: init's child that runs init's own command line (it is a fork
    of init)."""
    try:
        argv = init.cmdline()
        children = init.children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if child.cmdline() == argv and child.status() != psutil.STATUS_ZOMBIE:
                return child
        except psutil.Error:
            continue
    return None


def kill_supervisor(sc: Sidecar, sig: int = signal.SIGKILL) -> psutil.Process:
    sup = supervisor_of(init_of(sc))
    assert sup is not None, "no supervisor running"
    sup.send_signal(sig)
    return sup


def restarted(sc: Sidecar, n: int, timeout: float = 15.0) -> dict[str, Any]:
    """/status of the n-th supervisor (init started it again after n crashes) once its CLI
    runs."""
    return sc.wait_status(
        lambda s: s["sidecar_restarts"] == n and s["cli_running"] and not s["resleeving"],
        f"supervisor restart {n} serving with the CLI running",
        timeout=timeout,
    )


def tmux(sc: Sidecar, *args: str) -> str:
    """What a tmux command on the sleeve's own socket prints (it must succeed)."""
    sock = str(sc.state_dir / "tmux.sock")
    done = subprocess.run(["tmux", "-S", sock, *args], capture_output=True, text=True, check=True)
    return done.stdout


def terminal_clients(sc: Sidecar) -> list[str]:
    """The ttys of the tmux clients attached to session main with a terminal (ttyd's, `sidecar
    attach`'s), leaving out the sidecar's own control-mode client, which is always there."""
    listing = tmux(sc, "list-clients", "-t", "main", "-F", "#{client_control_mode} #{client_tty}")
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("0 ")]


def pane_text(sc: Sidecar) -> str:
    """What the pane shows now, wrapped lines joined."""
    return tmux(sc, "capture-pane", "-p", "-J", "-t", "main")


# ---- gone --------------------------------------------------------------------------------------


def all_exited(pids: list[int]) -> bool:
    """Every one of `pids` has exited (a zombie, exited but not yet reaped, counts)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def none_left(procs: dict[int, float]) -> bool:
    """None of these processes (pid -> start time) runs any more: a pid taken again by a new
    process does not count as the old one, a zombie counts as gone."""
    for pid, created in procs.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def reaped(pid: int) -> bool:
    """`pid` has exited and its parent has reaped it: nothing is left of it in /proc."""
    return not os.path.exists(f"/proc/{pid}")
