"""Resleeve: POST /resleeve -> the old CLI tree is gone and a new CLI pid runs.

Baselines, interleaved with it: the seed's procedure (send-keys C-c, sleep 1, `exit`, type the
new command) and raw `tmux respawn-pane -k` (the floor). All three swap a CLI that exits on
SIGTERM/SIGINT/SIGHUP (`signal.pause()`); the end is observed the same way for each: pidfds
for the old processes, then /proc for the new CLI under the tmux server.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.context import Context
from bench.core import Baseline, Check, Figure, Target, interleave
from bench.procs import (
    PAUSE_ARGV,
    BenchError,
    cli_pid,
    find_pause_cli,
    get_json,
    make_sidecar,
    post_json,
    start_sidecar,
    stop_sidecar,
    wait_gone,
    wait_until,
)

NAMES = ("resleeve.seed", "resleeve.floor")
SWAP_TIMEOUT = 15.0
# The seed's shell CLI ran inside the pane's shell; `exit` leaves it, then the new CLI is typed.
INNER_SHELL = "bash --norc --noprofile"


@dataclass
class TmuxServer:
    sock: Path
    pid: int

    def cmd(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.sock), *args], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            msg = f"tmux {args[0]}: {done.stderr.strip()}"
            raise BenchError(msg)
        return done.stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.cmd("send-keys", "-t", "main:0.0", *(["-l"] if literal else []), *keys)


@contextlib.contextmanager
def tmux_server(tmp: Path, argv: list[str]) -> Iterator[TmuxServer]:
    sock = tmp / "tmux.sock"
    env = {**os.environ, "PS1": "$ ", "SHELL": "/bin/bash"}
    base = ["tmux", "-S", str(sock), "-f", "/dev/null"]
    subprocess.run(
        [*base, "new-session", "-d", "-s", "main", "-x", "200", "-y", "50", *argv],
        env=env,
        check=True,
        capture_output=True,
    )
    try:
        out = subprocess.run(
            [*base, "display-message", "-p", "#{pid}"], capture_output=True, text=True, check=True
        )
        yield TmuxServer(sock, int(out.stdout))
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, check=False)


def _swap(server_pid: int, old: list[int], start: float) -> float:
    """Seconds from `start` until every `old` pid is gone and a new pause CLI runs."""
    wait_gone(old, SWAP_TIMEOUT)
    wait_until(
        lambda: find_pause_cli(server_pid, set(old), depth=4),
        SWAP_TIMEOUT,
        "the new CLI",
        interval=0.0005,
    )
    return time.perf_counter() - start


def _sidecar_round(port: int) -> float:
    def settled() -> int | None:
        code, body = get_json(port, "/status")
        return (
            body["cli_pid"]
            if code == 200 and body["cli_running"] and not body["resleeving"]
            else None
        )

    old_cli = wait_until(settled, SWAP_TIMEOUT, "the CLI to run", interval=0.01)
    waiter = psutil.Process(old_cli).ppid()
    server = psutil.Process(waiter).ppid()
    start = time.perf_counter()
    code, body = post_json(port, "/resleeve")
    if code != 202:
        msg = f"POST /resleeve answered {code}: {body}"
        raise BenchError(msg)
    took = _swap(server, [old_cli, waiter], start)
    # Outside the timing: the sidecar must report the very pid we saw.
    seen = find_pause_cli(server, {old_cli, waiter}, depth=4)
    wait_until(lambda: settled() == seen, SWAP_TIMEOUT, "/status to show the new pid", 0.01)
    return took


def _floor_round(srv: TmuxServer) -> float:
    old = wait_until(lambda: find_pause_cli(srv.pid, set()), SWAP_TIMEOUT, "the CLI")
    start = time.perf_counter()
    srv.cmd("respawn-pane", "-k", "-t", "main:0.0", *PAUSE_ARGV)
    return _swap(srv.pid, [old], start)


def _seed_round(srv: TmuxServer) -> float:
    # Set-up, not timed: a shell CLI in the pane's shell, running the CLI.
    srv.keys(INNER_SHELL, literal=True)
    srv.keys("Enter")
    srv.keys(shlex.join(PAUSE_ARGV), literal=True)
    srv.keys("Enter")
    old = wait_until(lambda: find_pause_cli(srv.pid, set(), depth=4), SWAP_TIMEOUT, "the CLI")
    inner = psutil.Process(old).ppid()
    start = time.perf_counter()
    srv.keys("C-c")
    time.sleep(1.0)  # sleep-ok: the seed procedure's own fixed wait, part of what is measured
    srv.keys("exit", literal=True)
    srv.keys("Enter")
    srv.keys(shlex.join(PAUSE_ARGV), literal=True)
    srv.keys("Enter")
    took = _swap(srv.pid, [old, inner], start)
    # Leave the pane's own shell with nothing running for the next round.
    new = find_pause_cli(srv.pid, {old, inner}, depth=4)
    srv.keys("C-c")
    if new is not None:
        wait_gone([new], SWAP_TIMEOUT)
    return took


def run(ctx: Context) -> list[Figure]:
    sc = make_sidecar(ctx.scratch("rs"), cli="pause")
    try:
        start_sidecar(sc)
        with (
            tmux_server(ctx.scratch("rf"), PAUSE_ARGV) as floor,
            tmux_server(ctx.scratch("rd"), ["bash", "--norc", "--noprofile"]) as seed,
        ):
            got = interleave(
                ctx.pick(2, 11),
                {
                    "sidecar": lambda: _sidecar_round(sc.port) * 1000,
                    "floor": lambda: _floor_round(floor) * 1000,
                    "seed": lambda: _seed_round(seed) * 1000,
                },
            )
        final = cli_pid(sc)
    finally:
        stop_sidecar(sc)
    target = Target(
        "≤250 ms; ≥5× faster than seed (ratio ≤0.2)",
        (Check("value", "<=", 250), Check("ratio", "<=", 0.2)),
    )
    notes = f"last CLI pid {final}"
    return [
        Figure(
            "resleeve.seed",
            "resleeve: POST → old tree gone, new CLI running (vs seed procedure)",
            "ms",
            got["sidecar"],
            Baseline("seed: C-c, sleep 1, exit, retype", got["seed"]),
            target,
            notes,
        ),
        Figure(
            "resleeve.floor",
            "resleeve (vs raw `tmux respawn-pane -k`, the floor)",
            "ms",
            got["sidecar"],
            Baseline("respawn-pane -k", got["floor"]),
        ),
    ]
