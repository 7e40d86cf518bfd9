"""wrk, the HTTP load generator: run it against a loopback URL and parse what it prints."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.procs import BenchError

CONNECTIONS = 50
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p99_ms: float
    requests: int
    non_2xx: int  # wrk counts 3xx as fine too; none of the routes measured redirects
    socket_errors: int


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        msg = "wrk not found on PATH (scripts/setup --test installs it)"
        raise BenchError(msg)
    return found


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if m is None:
        msg = f"unreadable wrk latency {text!r}"
        raise BenchError(msg)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse(output: str) -> WrkResult:
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", output, re.M)
    total = re.search(r"^\s+(\d+) requests in", output, re.M)
    if rps is None or p99 is None or total is None:
        msg = f"unreadable wrk output:\n{output}"
        raise BenchError(msg)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    sock = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    return WrkResult(
        rps=float(rps.group(1)),
        p99_ms=_ms(p99.group(1)),
        requests=int(total.group(1)),
        non_2xx=int(non2xx.group(1)) if non2xx else 0,
        socket_errors=sum(int(g) for g in sock.groups()) if sock else 0,
    )


def run(url: str, seconds: float, script: Path | None = None) -> WrkResult:
    """`wrk -t1 -c50 -d<N>s --latency URL`; loopback only."""
    if not url.startswith("http://127.0.0.1:"):
        msg = f"benchmarks talk to 127.0.0.1 only, not {url}"
        raise BenchError(msg)
    argv = [wrk_binary(), "-t1", f"-c{CONNECTIONS}", f"-d{max(1, round(seconds))}s", "--latency"]
    if script is not None:
        argv += ["-s", str(script)]
    done = subprocess.run(
        [*argv, url], capture_output=True, text=True, timeout=seconds + 30, check=False
    )
    if done.returncode != 0:
        msg = f"wrk failed ({done.returncode}): {done.stderr.strip()}"
        raise BenchError(msg)
    return parse(done.stdout)
