"""The egress proxy inside a real sidecar (`SIDECAR_EGRESS_ALLOW` naming a loopback data
server): a 100 MB download through a CONNECT tunnel against the same download direct, the
connection setup (connect, and for the proxy CONNECT and its answer, then the first byte)
against a direct connect, 200 tunnels held at once, and the sidecar's idle memory with the
proxy against one without. Every figure is bounded to well under 20 s."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import psutil

from bench.context import Context
from bench.core import Baseline, Check, Figure, Target, at_most, interleave, ratio_at_least
from bench.procs import BenchError, cli_pid, memory, own_procs, running

NAMES = ("egress.download", "egress.setup", "egress.tunnels", "egress.memory")
DOWNLOAD = 100 * 1000 * 1000
TUNNELS = 200
# The data server, a process of its own (no GIL shared with the client): port A sends DOWNLOAD
# bytes on every connection and closes; port B sends one byte and holds until the client goes.
SERVER = """
import socket, sys, threading
size = int(sys.argv[1])
chunk = b"x" * (1 << 20)
def bulk(c):
    with c:
        left = size
        while left > 0:
            n = c.send(chunk[: min(left, len(chunk))])
            left -= n
def hold(c):
    with c:
        c.sendall(b"x")
        while c.recv(4096):
            pass
def serve(s, work):
    while True:
        c, _ = s.accept()
        threading.Thread(target=work, args=(c,), daemon=True).start()
socks = []
for work in (bulk, hold):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1024)
    socks.append(s)
    threading.Thread(target=serve, args=(s, work), daemon=True).start()
print(*(s.getsockname()[1] for s in socks), flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def data_server() -> Iterator[tuple[int, int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(DOWNLOAD)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        bulk, hold = (int(p) for p in proc.stdout.readline().split())
        yield bulk, hold
    finally:
        proc.kill()
        proc.wait()


def proxy_port(pid: int) -> int:
    """The proxy's port, as the CLI's environment names it. The pane runs the egress guard,
    which gives the CLI's variables to the CLI alone: the CLI is among its descendants."""
    pane = psutil.Process(pid)
    for proc in (pane, *pane.children(recursive=True)):
        with contextlib.suppress(psutil.Error):
            proxy = proc.environ().get("HTTPS_PROXY")
            if proxy:
                return int(proxy.rpartition(":")[2])
    msg = "the CLI's environment names no HTTPS_PROXY"
    raise BenchError(msg)


def open_tunnel(proxy: int, port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy), timeout=10)
    s.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        got = s.recv(1)
        if not got:
            msg = f"the proxy closed the tunnel: {head!r}"
            raise BenchError(msg)
        head += got
    if not head.startswith(b"HTTP/1.1 200 "):
        msg = f"the proxy refused the tunnel: {head!r}"
        raise BenchError(msg)
    return s


def direct(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def download(sock: socket.socket) -> float:
    """MB/s reading DOWNLOAD bytes from `sock`."""
    buf = bytearray(1 << 20)
    got = 0
    began = time.perf_counter()
    with sock:
        while got < DOWNLOAD:
            n = sock.recv_into(buf)
            if not n:
                msg = f"the download ended after {got} bytes"
                raise BenchError(msg)
            got += n
    return DOWNLOAD / 1e6 / (time.perf_counter() - began)


def setup_ms(connect: Callable[[], socket.socket]) -> float:
    """Milliseconds from the connect until the far end's first byte."""
    began = time.perf_counter()
    with connect() as s:
        if s.recv(1) != b"x":
            msg = "no first byte"
            raise BenchError(msg)
        return (time.perf_counter() - began) * 1000


def hold_tunnels(proxy: int, port: int) -> int:
    """Tunnels open at once, each carrying its first byte."""
    with ThreadPoolExecutor(32) as pool:
        socks = list(pool.map(lambda _: open_tunnel(proxy, port), range(TUNNELS)))
    try:
        return sum(s.recv(1) == b"x" for s in socks)
    finally:
        for s in socks:
            s.close()


def run(ctx: Context) -> list[Figure]:
    with data_server() as (bulk, hold):
        allow = f"127.0.0.1:{bulk},127.0.0.1:{hold}"
        with (
            running(ctx.scratch("eg"), SIDECAR_EGRESS_ALLOW=allow) as sc,
            running(ctx.scratch("eo")) as plain,
        ):
            pid = cli_pid(sc)
            if pid is None:
                msg = "the sidecar's CLI is not running"
                raise BenchError(msg)
            proxy = proxy_port(pid)
            # Idle, before any traffic: what the proxy costs a sleeve that does not use it.
            with_proxy, without = memory(own_procs(sc)), memory(own_procs(plain))
            rates = interleave(
                ctx.pick(1, 5),
                {
                    "proxy": lambda: download(open_tunnel(proxy, bulk)),
                    "direct": lambda: download(direct(bulk)),
                },
            )
            setups = interleave(
                ctx.pick(20, 200),
                {
                    "proxy": lambda: setup_ms(lambda: open_tunnel(proxy, hold)),
                    "direct": lambda: setup_ms(lambda: direct(hold)),
                },
                warmup=5,
            )
            held = [float(hold_tunnels(proxy, hold))]
    extra_setup = [p - d for p, d in zip(setups["proxy"], setups["direct"], strict=True)]
    return [
        Figure(
            "egress.download",
            "100 MB download through the egress proxy (CONNECT)",
            "MB/s",
            rates["proxy"],
            Baseline("direct on loopback", rates["direct"]),
            ratio_at_least(0.9, "≥0.9× direct"),
        ),
        Figure(
            "egress.setup",
            "connection setup through the proxy, more than direct (median of pairs)",
            "ms",
            extra_setup,
            notes=f"direct median {sorted(setups['direct'])[len(setups['direct']) // 2]:.3f} ms",
            target=at_most(1.0, "≤1 ms more than direct"),
        ),
        Figure(
            "egress.tunnels",
            f"tunnels held at once ({TUNNELS} asked)",
            "tunnels",
            held,
            target=Target(f"all {TUNNELS}", (Check("value", ">=", TUNNELS),)),
        ),
        Figure(
            "egress.memory",
            "idle memory with the egress proxy on, more than without (USS, sidecar processes)",
            "MiB",
            [with_proxy.uss - without.uss],
            target=at_most(3.0, "≤3 MiB more"),
            notes=f"with {with_proxy.uss:.1f} MiB, without {without.uss:.1f} MiB",
        ),
    ]
