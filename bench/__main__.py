"""`scripts/bench [--quick] [--out PATH] [--only GROUP,...] [--docs PATH]...`

Runs every figure group, prints the markdown table on stdout, writes the JSON (default
`bench-results.json` in the current directory). A group that fails still lists its figures,
with the error instead of a value, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import core
from bench.context import Context
from bench.figures import (
    agent,
    approvals,
    clis,
    crash,
    egress,
    http,
    idle,
    keys,
    launcher,
    notify,
    outbox,
    policy,
    record,
    resleeve,
    scale,
    screen,
    soak,
    start,
    terminal,
    tls,
)

log = logging.getLogger("bench")

# The idle-CPU window opens first and closes last: the idle sidecar sits untouched while the
# other groups run (its CPU time is its own; the others only share the machine with it).
GROUPS: dict[str, ModuleType] = {
    "start": start,
    "resleeve": resleeve,
    "crash": crash,
    "http": http,
    "egress": egress,
    "tls": tls,
    "outbox": outbox,
    "terminal": terminal,
    "agent": agent,
    "screen": screen,
    "approvals": approvals,
    "policy": policy,
    "keys": keys,
    "record": record,
    "notify": notify,
    "clis": clis,
    "launcher": launcher,
    "scale": scale,
    "soak": soak,
}
ORDER = [
    "start",
    "resleeve",
    "crash",
    "http",
    "idle",
    "egress",
    "tls",
    "outbox",
    "terminal",
    "agent",
    "screen",
    "approvals",
    "policy",
    "keys",
    "record",
    "notify",
    "clis",
    "launcher",
    "scale",
    "soak",
]
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


def _failed(module: ModuleType, exc: BaseException) -> list[core.Figure]:
    text = f"{type(exc).__name__}: {exc}"
    return [core.Figure(name, name, "", [], error=text) for name in module.NAMES]


def _guard(module: ModuleType, func: Callable[[], list[core.Figure]]) -> list[core.Figure]:
    started = time.monotonic()
    name = module.__name__.rsplit(".", 1)[-1]
    log.info("%s ...", name)
    try:
        figures = func()
    except Exception as exc:  # one group failing must not hide the others' figures
        log.error("%s failed:\n%s", name, traceback.format_exc())
        figures = _failed(module, exc)
    log.info("%s done in %.1fs", name, time.monotonic() - started)
    return figures


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def write_docs(path: Path, table: str, heading: str) -> None:
    """Replace the table between the bench markers in `path` (created if missing)."""
    block = f"{BEGIN}\n{heading}\n\n{table}\n{END}"
    text = (
        path.read_text(encoding="utf-8") if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    )
    if BEGIN not in text:
        text = text.rstrip("\n") + f"\n\n{BEGIN}\n{END}\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: block, text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every figure, briefly (~3–4 min)")
    parser.add_argument("--out", default="bench-results.json", help="JSON output path")
    parser.add_argument(
        "--only", help=f"comma-separated groups to run (of: {', '.join(ORDER)})", default=""
    )
    parser.add_argument(
        "--docs",
        metavar="PATH",
        action="append",
        default=[],
        help="also put the table into this markdown file (repeatable)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(format="bench: %(message)s", stream=sys.stderr)
    # Only the benchmark's own progress lines; the sidecar code it calls stays quiet.
    logging.getLogger("bench").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    wanted = [g for g in args.only.split(",") if g] or ORDER
    unknown = set(wanted) - set(ORDER)
    if unknown:
        parser.error(f"unknown groups: {', '.join(sorted(unknown))}")

    started = time.monotonic()
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    info = machine()
    tmp = Path(tempfile.mkdtemp(prefix="bn-"))
    ctx = Context(quick=args.quick, tmp=tmp)
    figures: list[core.Figure] = []
    window = None
    try:
        if "idle" in wanted:
            try:
                window = idle.begin(ctx)
            except Exception as exc:  # reported as the group's failure below
                log.error("idle failed to start:\n%s", traceback.format_exc())
                figures += _failed(idle, exc)
        for name in ORDER:
            if name in wanted and name != "idle":
                module = GROUPS[name]
                figures += _guard(module, lambda m=module: m.run(ctx))
        if window is not None:
            figures += _guard(idle, lambda: idle.finish(ctx, window))
    finally:
        if window is not None:
            idle.close(window)
        shutil.rmtree(tmp, ignore_errors=True)

    elapsed = time.monotonic() - started
    info["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    table = core.table(figures)
    kind = "quick" if args.quick else "full"
    load = f"load average {info['load_avg_at_start'][0]} → {info['load_avg_at_end'][0]}"
    print(f"Benchmarks, {date} ({kind} run, {elapsed:.0f} s, {info['cpus']} CPUs, {load})\n")
    print(table)
    result = {
        "date": date,
        "quick": args.quick,
        "duration_s": round(elapsed, 1),
        "machine": info,
        "figures": {f.name: f.as_json() for f in figures},
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    log.info("wrote %s (%.0f s in all)", out, elapsed)
    heading = f"Latest {kind} run: {date}, {elapsed:.0f} s, {info['cpus']} CPUs, {load}."
    for doc in args.docs:
        write_docs(Path(doc), table, heading)
    return 1 if any(f.error for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
