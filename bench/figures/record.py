"""The flight recorder and the agent's bill (issue 35's targets), each beside its baseline in the
same run, interleaved:

- recorder CPU: a CLI streams 10 MB of coloured log lines (paced at 2 MB/s, as a chatty build
  would, and unpaced); CPU seconds of the sleeve's own processes (init, supervisor, tmux, ttyd,
  the pane's waiter: the CLI's tree left out) with recording on against `SIDECAR_RECORD=off`;
  the difference as a share of one core over the stream's duration. Both are floods (over the
  control client's FLOOD rate): recorded as a frame a second. Beside them, how long the unpaced
  stream takes (the recorder must not slow it);
- byte for byte: 4 MB at 500 kB/s, under the flood rate, every byte recorded: the recording's
  size against the output's, and the CPU it costs per MB;
- OTLP export handling: the round trip of a usage report (Claude Code's own batch shape, with
  one `api_request`) against the same request refused for its secret (the HTTP round trip);
- memory: USS of the sleeve's processes with recording on and reports counted, against a sleeve
  with recording off and no reports, after the same stream;
- idle wake-ups: context switches of the sleeve's processes over an idle window, recording on
  against off.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave, ratio_at_most
from bench.procs import (
    BenchError,
    cpu_seconds,
    memory,
    own_procs,
    start_sidecar,
    stop_sidecar,
    wait_until,
)
from tests.harness import Sidecar, write_cli_config

NAMES = (
    "record.cpu_paced",
    "record.cpu_unpaced",
    "record.slowdown",
    "record.bytes",
    "record.exact_cpu",
    "record.otlp",
    "record.memory",
    "record.wakeups",
)
STREAM = 10 * 1000 * 1000
PACE = 2 * 1000 * 1000  # bytes per second of the paced stream
EXACT, EXACT_PACE = 4 * 1000 * 1000, 500 * 1000  # under the flood rate: every byte recorded
# A stand-in `claude` (the registry gives it Claude Code's knowledge: our telemetry variables)
# that prints STREAM bytes of coloured log lines each time a line comes in, at PACE bytes a second
# or as fast as the pane takes them, then writes the stream's number to its done file.
STREAMER = """\
import sys, time
size, pace, done = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
line = b"\\x1b[32mPASS\\x1b[0m tests/test_module.py::test_case_number_%06d " + b"." * 24 + b"\\r\\n"
for n, _ in enumerate(sys.stdin):
    start, sent, i = time.monotonic(), 0, 0
    while sent < size:
        block = b"".join(line % (i + k) for k in range(64))
        sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
        sent, i = sent + len(block), i + 64
        if pace:
            ahead = sent / pace - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)  # sleep-ok: the stream's own pace
    with open(done, "w") as fh:
        fh.write(str(n))
"""
# Claude Code's batch as it sends one (2.1.330): resource attributes, then its log records.
BATCH_RECORDS = 6


def _claude(tmp: Path) -> Path:
    path = tmp / "bin" / "claude"
    path.parent.mkdir(parents=True)
    path.write_text(f"#!{sys.executable}\n{STREAMER}")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _sidecar(tmp: Path, *, record: bool, pace: float, size: int) -> Sidecar:
    claude = _claude(tmp)
    done = tmp / "done"
    entry = {"command": [str(claude), str(size), str(pace), str(done)], "state": "none"}
    config = write_cli_config(tmp / "clis.yaml", {"streamer": entry})
    env = {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_RECORD": "on" if record else "off"}
    return Sidecar(tmp / "sc", cli="streamer", env_extra=env)


@contextlib.contextmanager
def _running(tmp: Path, *, record: bool, pace: float, size: int = STREAM) -> Iterator[Sidecar]:
    sc = _sidecar(tmp, record=record, pace=pace, size=size)
    sc.tmp.mkdir(parents=True)
    try:
        start_sidecar(sc)
        yield sc
    finally:
        stop_sidecar(sc)


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _stream_once(sc: Sidecar, n: int) -> tuple[float, float]:
    """Type a line (the CLI streams), wait for its done file and for the pane to be drawn;
    CPU seconds of the sleeve's own processes, and the wall seconds it took."""
    procs = own_procs(sc)
    done = sc.tmp.parent / "done"
    before = cpu_seconds(procs)
    t0 = time.monotonic()
    status = _post(
        sc.port, "/input", json.dumps({"text": "go"}).encode(), {"Content-Type": "application/json"}
    )
    if status != 202:
        msg = f"POST /input answered {status}"
        raise BenchError(msg)
    wait_until(lambda: done.exists() and done.read_text() == str(n), 120, "the stream", 0.01)
    wall = time.monotonic() - t0
    after = cpu_seconds(procs)
    return sum(after[p] - before[p] for p in before if p in after), wall


def _cpu(ctx: Context, pace: float, size: int = STREAM) -> dict[str, list[float]]:
    """CPU seconds of the sleeve's processes and the stream's wall seconds, recording on and
    off, interleaved; and the recording's size over the output's."""
    rounds = ctx.pick(1, 3)
    with (
        _running(ctx.scratch("rc"), record=True, pace=pace, size=size) as on,
        _running(ctx.scratch("rc"), record=False, pace=pace, size=size) as off,
    ):
        counts = {"on": 0, "off": 0}

        def arm(sc: Sidecar, key: str) -> dict[str, float]:
            cpu, wall = _stream_once(sc, counts[key])
            counts[key] += 1
            return {"cpu": cpu, "wall": wall}

        samples = interleave(rounds, {"on": lambda: arm(on, "on"), "off": lambda: arm(off, "off")})
        recorded = sum(p.stat().st_size for p in (on.state_dir / "recordings").glob("*.cast"))
    samples["size"] = [recorded / (size * counts["on"])]
    return samples


def _cpu_figure(name: str, label: str, samples: dict[str, list[float]]) -> Figure:
    """The recorder's CPU: on - off, as a share of one core over the stream's duration."""
    on, off, walls = samples["on.cpu"], samples["off.cpu"], samples["on.wall"]
    return Figure(
        name,
        label,
        "% of a core",
        [100 * (a - b) / w for a, b, w in zip(on, off, walls, strict=True)],
        baseline=Baseline(
            "the sleeve, recording off", [100 * b / w for b, w in zip(off, walls, strict=True)]
        ),
        target=at_most(1.0, "≤1 % of a core more"),
        notes=f"CPU s on {on}, off {off}; the streams took {walls} s",
    )


def _otlp(ctx: Context) -> Figure:
    tmp = ctx.scratch("ro")
    claude = tmp / "bin" / "claude"
    claude.parent.mkdir()
    claude.write_text("#!/bin/sh\nexec sleep 3600\n")
    claude.chmod(claude.stat().st_mode | stat.S_IXUSR)
    config = write_cli_config(tmp / "clis.yaml", {"fake": {"command": [str(claude)]}})
    sc = Sidecar(tmp / "sc", cli="fake", env_extra={"SIDECAR_CLI_CONFIG": str(config)})
    sc.tmp.mkdir()
    try:
        start_sidecar(sc)
        pid = wait_until(lambda: _cli_pid(sc), 10, "the CLI")
        env = psutil.Process(pid).environ()
        endpoint = env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"]
        header, secret = env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"].split("=", 1)
        path = "/" + endpoint.split("/", 3)[3]
        body = batch()
        good = {header: secret, "Content-Type": "application/json"}
        bad = {header: "wrong", "Content-Type": "application/json"}
        n = ctx.pick(50, 500)

        def timed(headers: dict[str, str], want: int) -> float:
            t0 = time.perf_counter()
            status = _post(sc.port, path, body, headers)
            if status != want:
                msg = f"the report was answered {status}, not {want}"
                raise BenchError(msg)
            return time.perf_counter() - t0

        samples = interleave(
            n, {"ok": lambda: timed(good, 200), "refused": lambda: timed(bad, 401)}
        )
    finally:
        stop_sidecar(sc)
    # The handling is what a counted report takes beyond the HTTP round trip of one refused
    # before its body is read: the difference within each interleaved pair.
    refused = sorted(samples["refused"])
    return Figure(
        "record.otlp",
        f"OTLP usage report ({len(body):,} B, {BATCH_RECORDS} records) → 200, more than the "
        "same refused for its secret (median of pairs)",
        "ms",
        [1000 * (ok - no) for ok, no in zip(samples["ok"], samples["refused"], strict=True)],
        notes=f"refused: the HTTP round trip, median {1000 * refused[len(refused) // 2]:.3f} ms",
        target=at_most(1.0, "≤1 ms per request"),
    )


def _cli_pid(sc: Sidecar) -> int | None:
    from bench.procs import cli_pid

    with contextlib.suppress(OSError):
        return cli_pid(sc)
    return None


def batch() -> bytes:
    """A logs request shaped like Claude Code's: its resource, BATCH_RECORDS records, one of them
    an `api_request`."""

    def attrs(**values: object) -> list[dict[str, object]]:
        out = []
        for key, value in values.items():
            kind = "intValue" if isinstance(value, int) else "stringValue"
            if isinstance(value, float):
                kind = "doubleValue"
            out.append({"key": key.replace("_", "."), "value": {kind: value}})
        return out

    common = {"user_id": "e" * 64, "session_id": "437f209c-490e-4737-af3c-651e294566bc"}
    records = [
        {
            "timeUnixNano": "1795658694255000000",
            "body": {"stringValue": "claude_code.tool_result"},
            "attributes": attrs(**common, event_name="tool_result", tool_name="Bash"),
        }
        for _ in range(BATCH_RECORDS - 1)
    ]
    usage = attrs(**common, event_name="api_request", model="claude-opus-4-5")
    usage += [
        {"key": key, "value": {"intValue": value}}
        for key, value in (("input_tokens", 1234), ("output_tokens", 200))
    ]
    usage.append({"key": "cost_usd", "value": {"doubleValue": 0.0123}})
    records.append({"body": {"stringValue": "claude_code.api_request"}, "attributes": usage})
    resource = {"attributes": attrs(service_name="claude-code", service_version="2.1.330")}
    scope = {"scope": {"name": "com.anthropic.claude_code.events"}, "logRecords": records}
    body = {"resourceLogs": [{"resource": resource, "scopeLogs": [scope]}]}
    return json.dumps(body).encode()


def _switches(procs: list[psutil.Process]) -> int:
    """Context switches of every thread of `procs` so far: each wake-up is one."""
    total = 0
    for proc in procs:
        with contextlib.suppress(OSError):
            for thread in os.listdir(f"/proc/{proc.pid}/task"):
                with open(f"/proc/{proc.pid}/task/{thread}/status") as fh:
                    total += sum(int(line.split()[1]) for line in fh if "ctxt_switches" in line)
    return total


def _idle_and_memory(ctx: Context) -> list[Figure]:
    """Memory after a stream with both on (recording, reports counted) against both off; then
    wake-ups of each over an idle window."""
    window = ctx.seconds(3, 20)
    with (
        _running(ctx.scratch("rm"), record=True, pace=0) as on,
        _running(ctx.scratch("rm"), record=False, pace=0) as off,
    ):
        for sc in (on, off):
            _stream_once(sc, 0)
        env = psutil.Process(wait_until(lambda: _cli_pid(on), 10, "the CLI")).environ()
        header, secret = env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"].split("=", 1)
        path = "/" + env["OTEL_EXPORTER_OTLP_LOGS_ENDPOINT"].split("/", 3)[3]
        body = batch()
        for _ in range(ctx.pick(20, 200)):
            _post(on.port, path, body, {header: secret, "Content-Type": "application/json"})
        uss_on = memory(own_procs(on)).uss
        uss_off = memory(own_procs(off)).uss
        procs = {"on": own_procs(on), "off": own_procs(off)}
        before = {k: _switches(p) for k, p in procs.items()}
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() - t0 >= window, window + 5, "the idle window", 0.5)
        wall = time.monotonic() - t0
        rate = {k: (_switches(p) - before[k]) / wall for k, p in procs.items()}
    return [
        Figure(
            "record.memory",
            "memory, recording and usage both on (after a 10 MB stream and usage reports)",
            "MiB",
            [uss_on - uss_off],
            baseline=Baseline("USS with both off, MiB", [uss_off]),
            target=at_most(2.0, "+≤2 MiB"),
            notes=f"USS {uss_on:.1f} MiB on, {uss_off:.1f} MiB off",
        ),
        Figure(
            "record.wakeups",
            f"idle wake-ups with recording on, over {wall:.0f} s",
            "/s",
            [rate["on"] - rate["off"]],
            baseline=Baseline("wake-ups/s with recording off", [rate["off"]]),
            target=at_most(0.1, "unchanged (≤0.1/s more)"),
            notes=f"{rate['on']:.2f}/s on, {rate['off']:.2f}/s off (the supervisor's 1 s tick)",
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    # A quick run makes every figure from shorter streams (the labels name the full run's).
    stream, exact_size = ctx.pick(STREAM // 5, STREAM), ctx.pick(EXACT // 4, EXACT)
    paced = _cpu(ctx, PACE, stream)
    unpaced = _cpu(ctx, 0, stream)
    exact = _cpu(ctx, EXACT_PACE, exact_size)
    per_mb = [
        1000 * (a - b) / (exact_size / 1e6)
        for a, b in zip(exact["on.cpu"], exact["off.cpu"], strict=True)
    ]
    figures = [
        _cpu_figure("record.cpu_paced", "recorder CPU, 10 MB at 2 MB/s", paced),
        _cpu_figure("record.cpu_unpaced", "recorder CPU, 10 MB as fast as it goes", unpaced),
        Figure(
            "record.slowdown",
            "a CLI printing 10 MB as fast as it goes, recording on: seconds it takes",
            "s",
            unpaced["on.wall"],
            baseline=Baseline("recording off", unpaced["off.wall"]),
            target=ratio_at_most(1.1, "not slowed (≤1.1× off)"),
        ),
        Figure(
            "record.bytes",
            "recording size / raw output, byte for byte (4 MB of coloured log lines at 500 kB/s)",
            "×",
            exact["size"],
            target=at_most(1.3, "≤1.3×"),
        ),
        Figure(
            "record.exact_cpu",
            "recorder CPU per MB recorded byte for byte (the supervisor and tmux's control output)",
            "ms/MB",
            per_mb,
            notes="1 % of a core is spent at 10,000 / this kB/s of output recorded byte for byte",
        ),
        _otlp(ctx),
        *_idle_and_memory(ctx),
    ]
    if any(f.error for f in figures):
        msg = "a figure failed"
        raise BenchError(msg)
    return figures
