"""Processes the benchmark starts and measures: sidecars (through the test harness), the bare
aiohttp server, process trees, their memory (USS/RSS) and CPU time, and waits with deadlines.

Every wait polls a condition against a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sidecar.core.loopback import free_port
from tests.harness import REPO, Sidecar, write_cli_config

MiB = 1024 * 1024
# A CLI that ends on SIGTERM/SIGINT/SIGHUP. This interpreter by absolute path: a `python3` on
# PATH may be a shim (pyenv's is a bash script) that would add its own start-up to every swap.
PAUSE_ARGV = [sys.executable, "-c", "import signal; signal.pause()"]


class BenchError(Exception):
    """A measurement could not be taken; the message says what was missing."""


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.002
) -> Any:
    """Poll `predicate` until truthy; BenchError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            msg = f"timed out after {timeout:g}s waiting for {what}"
            raise BenchError(msg)
        time.sleep(interval)  # sleep-ok: polling interval of a deadline wait


def get_json(
    port: int, path: str, timeout: float = 2.0, token: str | None = None
) -> tuple[int, Any]:
    """GET http://127.0.0.1:port/path; raises OSError while nothing listens."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body)
    except ValueError:
        return resp.status, body


def post_json(port: int, path: str, body: Any = None, timeout: float = 5.0) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = b"" if body is None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        payload = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(payload) if payload else None


def answers(port: int, path: str = "/health") -> bool:
    try:
        return get_json(port, path)[0] == 200
    except OSError:
        return False


def fully_healthy(port: int, token: str | None = None) -> bool:
    """The CLI runs and ttyd answers (the supervisor marks ttyd running once its port accepts)."""
    try:
        code, body = get_json(port, "/status", token=token)
    except OSError:
        return False
    return code == 200 and body["cli_running"] and body["ttyd_state"] == "running"


# ---- process trees, memory, CPU -------------------------------------------------------------


def children_of(pid: int) -> list[int]:
    """Direct children from /proc (cheap: no scan of every process, unlike psutil)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def tree(pid: int) -> list[psutil.Process]:
    """`pid` and all its descendants that are alive now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sidecar_procs(init_pid: int, cli_pid: int | None) -> list[psutil.Process]:
    """The sidecar's own processes: init, supervisor, tmux server, ttyd, the pane's waiter —
    everything under the init process except the CLI's own tree (the workload it hosts)."""
    procs = tree(init_pid)
    cli = {p.pid for p in tree(cli_pid)} if cli_pid else set()
    return [p for p in procs if p.pid not in cli]


@dataclass(frozen=True)
class Memory:
    uss: float  # MiB, summed
    rss: float  # MiB, summed
    count: int


def memory(procs: Iterable[psutil.Process]) -> Memory:
    uss = rss = 0
    n = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            uss += info.uss
            rss += info.rss
            n += 1
    return Memory(uss / MiB, rss / MiB, n)


def kind(proc: psutil.Process) -> str:
    """Which part of a sleeve a process is: sidecar (init, supervisor), tmux, ttyd, other."""
    try:
        name = proc.name()
        argv = proc.cmdline()
    except psutil.Error:
        return "gone"
    if name.startswith("tmux"):
        return "tmux"
    if "sidecar" in argv[1:3] or argv[1:3] == ["-m", "sidecar"]:
        return "sidecar"
    return "ttyd" if "ttyd" in name else "other"


def memory_by_kind(procs: Iterable[psutil.Process]) -> dict[str, Memory]:
    groups: dict[str, list[psutil.Process]] = {}
    for proc in procs:
        groups.setdefault(kind(proc), []).append(proc)
    return {name: memory(members) for name, members in groups.items()}


def _run_ns(pid: int) -> int:
    """CPU time of `pid`'s live threads in nanoseconds, from /proc/PID/task/*/schedstat (its
    first field). Not utime+stime: those come in clock ticks (10 ms), and an idle sleeve uses
    one or two of them a minute, so a tick more or less would double the figure."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total


def cpu_seconds(procs: Iterable[psutil.Process]) -> dict[int, float]:
    out = {}
    for proc in procs:
        with contextlib.suppress(OSError):
            out[proc.pid] = _run_ns(proc.pid) / 1e9
    return out


# ---- waiting on processes -------------------------------------------------------------------


def wait_gone(pids: Iterable[int], timeout: float) -> None:
    """Block until every pid has exited (pidfd readable: exited, zombie or reaped)."""
    fds = []
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                fds.append(os.pidfd_open(pid))
        deadline = time.monotonic() + timeout
        pending = list(fds)
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                msg = f"processes still alive after {timeout:g}s"
                raise BenchError(msg)
            ready, _, _ = select.select(pending, [], [], left)
            pending = [fd for fd in pending if fd not in ready]
    finally:
        for fd in fds:
            os.close(fd)


def is_pause_cli(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return argv[:3] == [a.encode() for a in PAUSE_ARGV] and state != b"Z"


def find_pause_cli(root: int, exclude: set[int], depth: int = 3) -> int | None:
    """A running pause CLI within `depth` levels under `root` (not one of `exclude`)."""
    level = [root]
    for _ in range(depth):
        level = [c for p in level for c in children_of(p)]
        for pid in level:
            if pid not in exclude and is_pause_cli(pid):
                return pid
    return None


def stop_tree(pid: int) -> None:
    """Kill a process tree we started (teardown of a baseline)."""
    for proc in reversed(tree(pid)):
        with contextlib.suppress(psutil.Error):
            proc.kill()


# ---- the sidecar ----------------------------------------------------------------------------


def make_sidecar(tmp: Path, cli: str = "shell", **env: str) -> Sidecar:
    tmp.mkdir(parents=True, exist_ok=True)
    extra = dict(env)
    if cli == "pause":
        config = write_cli_config(tmp / "clis.yaml", {"pause": {"command": PAUSE_ARGV}})
        extra["SIDECAR_CLI_CONFIG"] = str(config)
    return Sidecar(tmp, cli=cli, env_extra=extra)


def start_sidecar(sc: Sidecar, timeout: float = 30.0) -> tuple[float, float]:
    """Start `sc`; seconds from exec to /health 200, and to fully healthy."""
    log = sc.log_path.open("ab")
    argv = [sys.executable, "-m", "sidecar", "run"]
    env = sc.env()
    start = time.perf_counter()
    sc.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=sc.tmp)
    log.close()

    def health() -> bool:
        if sc.proc is not None and sc.proc.poll() is not None:
            msg = f"sidecar exited with {sc.proc.returncode}: {sc.log()[-2000:]}"
            raise BenchError(msg)
        return answers(sc.port)

    wait_until(health, timeout, f"/health on :{sc.port}", interval=0.001)
    t_health = time.perf_counter() - start
    wait_until(lambda: fully_healthy(sc.port), timeout, "CLI and ttyd running", interval=0.002)
    return t_health, time.perf_counter() - start


def stop_sidecar(sc: Sidecar) -> None:
    with contextlib.suppress(Exception):  # teardown: get rid of whatever is left either way
        sc.stop(timeout=15)
    sc.kill_everything()


@contextlib.contextmanager
def running(tmp: Path, cli: str = "shell", **env: str) -> Iterator[Sidecar]:
    sc = make_sidecar(tmp, cli, **env)
    try:
        start_sidecar(sc)
        yield sc
    finally:
        stop_sidecar(sc)


def cli_pid(sc: Sidecar) -> int | None:
    code, body = get_json(sc.port, "/status")
    return body.get("cli_pid") if code == 200 else None


def own_procs(sc: Sidecar, cli: int | None = None) -> list[psutil.Process]:
    """`sidecar_procs` of `sc`, the CLI's tree found from `cli` (default: what /status says)."""
    assert sc.proc is not None
    return sidecar_procs(sc.proc.pid, cli if cli is not None else cli_pid(sc))


# ---- the bare aiohttp server (baseline) -----------------------------------------------------


@dataclass
class Bare:
    proc: subprocess.Popen[bytes]
    port: int

    def procs(self) -> list[psutil.Process]:
        return tree(self.proc.pid)


@contextlib.contextmanager
def bare_server() -> Iterator[Bare]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bare", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: answers(port, "/"), 15, f"bare aiohttp server on :{port}")
        yield Bare(proc, port)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
