"""HTTP throughput with wrk (1 thread, 50 connections): /health, /status, /outbox (1,000
messages) against a bare aiohttp hello world, interleaved; and the memory of all sidecar
processes (USS and RSS), idle and after that load, beside the bare server's."""

from __future__ import annotations

from bench import wrk
from bench.context import Context
from bench.core import Baseline, Figure, Target, at_most, interleave, ratio_at_least
from bench.messages import write_outbox
from bench.procs import BenchError, bare_server, get_json, memory, own_procs, running

NAMES = (
    "http.health.rps",
    "http.health.p99",
    "http.status.rps",
    "http.status.p99",
    "http.outbox.rps",
    "http.outbox.p99",
    "http.metrics.rps",
    "http.metrics.p99",
    "memory.idle.uss",
    "memory.idle.rss",
    "memory.load.uss",
    "memory.load.rss",
)
OUTBOX = 1_000
PATHS = {
    "health": ("/health", ratio_at_least(0.8, "≥0.8× bare req/s")),
    "status": ("/status", ratio_at_least(0.45, "≥0.45× bare req/s")),
    "outbox": ("/outbox", Target("report")),
    "metrics": ("/metrics", ratio_at_least(0.3, "≥0.3× bare req/s")),
}


def _load(url: str, seconds: float, errors: dict[str, int]) -> dict[str, float]:
    got = wrk.run(url, seconds)
    errors["non_2xx"] += got.non_2xx
    errors["socket_errors"] += got.socket_errors
    errors["requests"] += got.requests
    return {"rps": got.rps, "p99": got.p99_ms}


def run(ctx: Context) -> list[Figure]:
    tmp = ctx.scratch("ht")
    write_outbox(tmp / "workspace", OUTBOX)
    seconds = ctx.seconds(1, 4)
    figures: list[Figure] = []
    with running(tmp) as sc, bare_server() as bare:
        code, body = get_json(sc.port, "/outbox", timeout=10)
        if code != 200 or len(body["messages"]) != OUTBOX:
            msg = f"/outbox did not list {OUTBOX} messages ({code})"
            raise BenchError(msg)
        idle, bare_idle = memory(own_procs(sc)), memory(bare.procs())
        if not ctx.quick:  # warm both up (first connections, lazy imports) before measuring
            wrk.run(f"{sc.url}/health", 1)
            wrk.run(f"http://127.0.0.1:{bare.port}/", 1)
        for name, (path, target) in PATHS.items():
            errs = {"non_2xx": 0, "socket_errors": 0, "requests": 0}
            base_errs = {"non_2xx": 0, "socket_errors": 0, "requests": 0}
            got = interleave(
                ctx.pick(1, 5),
                {
                    "sidecar": lambda p=path, e=errs: _load(sc.url + p, seconds, e),
                    "bare": lambda e=base_errs: _load(f"http://127.0.0.1:{bare.port}/", seconds, e),
                },
                warmup=0,
            )
            extra = {"wrk": {"seconds": seconds, "sidecar": errs, "bare": base_errs}}
            label = f"{path}" + (f" ({OUTBOX:,} messages)" if name == "outbox" else "")
            figures += [
                Figure(
                    f"http.{name}.rps",
                    f"{label}: requests/s (wrk, 50 conns)",
                    "req/s",
                    got["sidecar.rps"],
                    Baseline("bare aiohttp", got["bare.rps"]),
                    target,
                    extra=extra,
                ),
                Figure(
                    f"http.{name}.p99",
                    f"{label}: p99 latency",
                    "ms",
                    got["sidecar.p99"],
                    Baseline("bare aiohttp", got["bare.p99"]),
                ),
            ]
        loaded, bare_loaded = memory(own_procs(sc)), memory(bare.procs())
    for when, mine, base in (("idle", idle, bare_idle), ("load", loaded, bare_loaded)):
        text = "idle" if when == "idle" else "after the wrk load"
        figures += [
            Figure(
                f"memory.{when}.uss",
                f"memory {text}: USS of all sidecar processes",
                "MiB",
                [mine.uss],
                Baseline("bare aiohttp", [base.uss]),
                at_most(45, "≤45 MiB together"),
                notes=f"{mine.count} processes (CLI excluded)",
            ),
            Figure(
                f"memory.{when}.rss",
                f"memory {text}: RSS of all sidecar processes",
                "MiB",
                [mine.rss],
                Baseline("bare aiohttp", [base.rss]),
                notes="RSS counts shared pages once per process",
            ),
        ]
    return figures
