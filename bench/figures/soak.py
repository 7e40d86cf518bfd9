"""Load and soak (reliability): wrk with 50 connections against /health, /status and /outbox
in turn while the CLI prints continuously and CURRENT.md is rewritten 10 times a second, with
200 `/events` clients reading all the while. Passes with 0 non-2xx answers, 0 socket errors,
memory after <= memory before + 5 MiB, and every client receiving every event.

The memory target leaves out the tmux server: it grows with the printing CLI's scrollback, which
is bounded by design (history-limit, 50,000 lines), so it is reported beside the target with
the history it holds; the +5 MiB applies to every other sidecar process.

Each rewrite changes the Task, and a GET /status after it makes the sidecar notice at once, so
each rewrite is exactly one `progress-update` event that every client must see.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from bench import wrk
from bench.context import Context
from bench.core import Figure, Target, at_most
from bench.messages import write_outbox
from bench.procs import (
    BenchError,
    Memory,
    MiB,
    make_sidecar,
    memory_by_kind,
    own_procs,
    start_sidecar,
    stop_sidecar,
)
from tests.harness import Sidecar, write_cli_config

NAMES = (
    "soak.non_2xx",
    "soak.socket_errors",
    "soak.memory_growth",
    "soak.memory_growth.sidecar",
    "soak.memory_growth.tmux_scrollback",
    "soak.memory_growth.total",
    "soak.rps",
    "events.missed",
)
REWRITES_PER_S = 10
SHUTDOWN_LIMIT = 30
OUTBOX = 100
# Prints ~200 lines a second; bounded (stops by itself after ~20 minutes).
PRINTER = (
    "import time\n"
    "for i in range(250_000):\n"
    "    print(i, 'output ' * 10, flush=True)\n"
    "    time.sleep(0.005)\n"
)
ROTATE = """
local paths = {"/health", "/status", "/outbox"}
local i = 0
request = function()
    i = i + 1
    return wrk.format("GET", paths[(i % #paths) + 1])
end
"""
CURRENT = (
    "# Current State\n\n## Status\nworking\n\n## Task\n{task}\n\n## Progress\n- [x] a\n- [ ] b\n"
)


def _write_current(path: Path, task: str) -> None:
    tmp = path.with_name(".CURRENT.md.bench")
    tmp.write_text(CURRENT.format(task=task), encoding="utf-8")
    os.replace(tmp, path)


class Client:
    """One /events reader collecting the tasks of progress-update events."""

    def __init__(self, news: asyncio.Event) -> None:
        self.news = news  # shared: set whenever any client receives an event
        self.tasks: list[str] = []
        self.connected = asyncio.Event()
        self.error: str | None = None

    async def read(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=None)) as resp:
                self.connected.set()
                async for line in resp.content:
                    event = json.loads(line)
                    if event.get("type") == "progress-update":
                        self.tasks.append(event["task"])
                        self.news.set()
        except (aiohttp.ClientError, ValueError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            self.connected.set()


async def _soak(
    base: str, current: Path, seconds: float, clients: int, script: Path
) -> tuple[wrk.WrkResult, list[str], list[Client]]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        news = asyncio.Event()
        readers = [Client(news) for _ in range(clients)]
        tasks = [asyncio.create_task(r.read(session, base + "/events")) for r in readers]
        try:
            await asyncio.wait_for(asyncio.gather(*(r.connected.wait() for r in readers)), 30)
            load = asyncio.create_task(asyncio.to_thread(wrk.run, base + "/", seconds, script))
            sent: list[str] = []
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < seconds:
                task = f"soak-{n}"
                await asyncio.to_thread(_write_current, current, task)
                async with session.get(base + "/status") as resp:
                    if resp.status != 200:
                        msg = f"/status answered {resp.status} during the soak"
                        raise BenchError(msg)
                sent.append(task)
                n += 1
                # Pace to REWRITES_PER_S; the sleep is the rewrite rate, not synchronisation.
                await asyncio.sleep(max(0.0, start + n / REWRITES_PER_S - time.monotonic()))
            result = await load
            # Let the last events reach every client (bounded wait).
            deadline = time.monotonic() + 10
            while any(r.tasks[-1:] != sent[-1:] for r in readers if r.error is None):
                news.clear()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(news.wait(), left)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return result, sent, readers


def _growth(before: dict[str, Memory], after: dict[str, Memory], part: str) -> float:
    if part not in before or part not in after:
        msg = f"no {part} process found in the sleeve"
        raise BenchError(msg)
    return after[part].uss - before[part].uss


def _uss(parts: dict[str, Memory], but: str = "") -> float:
    """USS summed over the parts of a sleeve (all of them, or all `but` one)."""
    return sum(mem.uss for kind, mem in parts.items() if kind != but)


def _history(sc: Sidecar) -> tuple[int, int]:
    """(lines of scrollback the CLI's pane holds, its history-limit), as tmux itself says."""
    done = subprocess.run(
        ["tmux", "-S", str(sc.state_dir / "tmux.sock"), "display-message", "-p", "-t", "main",
         "#{history_size} #{history_limit}"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    try:
        size, limit = (int(x) for x in done.stdout.split())
    except ValueError:
        msg = f"tmux did not say the pane's history: {done.stderr.strip() or done.stdout!r}"
        raise BenchError(msg) from None
    return size, limit


def _scrollback_notes(growth: float, history: tuple[int, int], history_after: int) -> str:
    """The history the growth came with, and what a full history would cost at that rate."""
    lines, limit = history_after - history[0], history[1]
    text = f"pane history {history[0]:,} → {history_after:,} of history-limit {limit:,} lines"
    if lines > 0 and growth > 0:
        per_line = growth * MiB / lines
        text += f"; ≈{per_line:.0f} B/line, ≈{per_line * limit / MiB:.0f} MiB when full"
    return text


def run(ctx: Context) -> list[Figure]:
    tmp = ctx.scratch("so")
    config = write_cli_config(
        tmp / "clis.yaml", {"printer": {"command": [sys.executable, "-c", PRINTER]}}
    )
    write_outbox(tmp / "workspace", OUTBOX)
    current = tmp / "workspace" / ".cstack" / "CURRENT.md"
    current.parent.mkdir(parents=True, exist_ok=True)
    _write_current(current, "warm-up")
    script = tmp / "rotate.lua"
    script.write_text(ROTATE, encoding="utf-8")
    seconds = ctx.seconds(3, 30)
    clients = ctx.pick(20, 200)
    sc = make_sidecar(tmp, cli="printer", SIDECAR_CLI_CONFIG=str(config))
    try:
        start_sidecar(sc)
        wrk.run(sc.url + "/", 1, script)  # warm-up: first requests, lazy imports
        parts_before, history = memory_by_kind(own_procs(sc)), _history(sc)
        result, sent, readers = asyncio.run(_soak(sc.url, current, seconds, clients, script))
        parts_after, (history_after, _) = memory_by_kind(own_procs(sc)), _history(sc)
        # How long SIGTERM takes once the /events clients have gone (recorded, not a target).
        assert sc.proc is not None
        stopping = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        try:
            sc.proc.wait(SHUTDOWN_LIMIT)
            shutdown = f"{time.monotonic() - stopping:.1f} s"
        except subprocess.TimeoutExpired:
            shutdown = f"more than {SHUTDOWN_LIMIT} s"
    finally:
        stop_sidecar(sc)
    failed = [r.error for r in readers if r.error]
    missed = sum(len(set(sent) - set(r.tasks)) for r in readers)
    complete = sum(1 for r in readers if not r.error and set(sent) <= set(r.tasks))
    if failed:
        missed += len(sent) * len(failed)
    load = f"wrk 50 conns × {seconds:g} s over /health, /status, /outbox ({OUTBOX} messages)"
    before, after = _uss(parts_before), _uss(parts_after)
    tmux = _growth(parts_before, parts_after, "tmux")
    python = _growth(parts_before, parts_after, "sidecar")
    extra = {"requests": result.requests, "load": load, "shutdown_after_soak": shutdown}
    return [
        Figure(
            "soak.non_2xx",
            "soak: non-2xx answers (wrk /health+/status+/outbox, CLI printing, CURRENT.md 10/s)",
            "",
            [float(result.non_2xx)],
            target=at_most(0, "0"),
            notes=f"SIGTERM → exit took {shutdown} after the soak",
            extra=extra,
        ),
        Figure(
            "soak.socket_errors",
            "soak: socket errors",
            "",
            [float(result.socket_errors)],
            target=at_most(0, "0"),
            extra=extra,
        ),
        Figure(
            "soak.memory_growth",
            "soak: USS after − before, all sidecar processes but the tmux server "
            "(init, supervisor, ttyd, pane waiter)",
            "MiB",
            [_uss(parts_after, but="tmux") - _uss(parts_before, but="tmux")],
            target=at_most(5, "≤5 MiB"),
            notes="the tmux server is left out: its growth is the scrollback, bounded by design",
        ),
        Figure(
            "soak.memory_growth.sidecar",
            "soak: of which the Python processes (init + supervisor)",
            "MiB",
            [python],
            notes="heap high-water mark of the load and the /events clients",
        ),
        Figure(
            "soak.memory_growth.tmux_scrollback",
            "soak: USS after − before, the tmux server (the printing CLI's scrollback)",
            "MiB",
            [tmux],
            target=Target(f"none: bounded by history-limit ({history[1]:,} lines)"),
            notes=_scrollback_notes(tmux, history, history_after),
        ),
        Figure(
            "soak.memory_growth.total",
            "soak: USS after − before, all sidecar processes (tmux server included)",
            "MiB",
            [after - before],
            notes=f"before {before:.1f} MiB, after {after:.1f} MiB",
        ),
        Figure(
            "soak.rps",
            "soak: requests/s over the mixed load",
            "req/s",
            [result.rps],
            extra=extra,
        ),
        Figure(
            "events.missed",
            f"events: {clients} /events clients × {len(sent)} events, events missed",
            "",
            [float(missed)],
            target=at_most(0, "0 (all receive every event)"),
            notes=f"{complete}/{clients} clients got every event"
            + (f"; errors: {failed[0]}" if failed else ""),
        ),
    ]
