"""The egress proxy's TLS termination for a host with a secret, against a blind CONNECT tunnel to
the same HTTPS server: per request on a kept-alive connection (latency and rate), a 20 MB
download, and the proxy's memory with the CA loaded. At the proxy level: the proxy runs in a
process of its own as the supervisor runs it (the sidecar's wiring of secrets is not measured
here), the server is a process of its own, the client this one. Bounded well under 30 s."""

from __future__ import annotations

import contextlib
import http.client
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave, ratio_at_least
from bench.procs import memory

NAMES = ("tls.request", "tls.rate", "tls.download", "tls.blind", "tls.memory")
BIG = 20 * 1000 * 1000
# The HTTPS server: `/small` answers 64 bytes, `/big` BIG bytes, keep-alive.
SERVER = """
import ssl, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
BODY = {"/small": b"x" * 64, "/big": b"x" * int(sys.argv[3])}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the head and the body are two writes
    def log_message(self, *a): pass
    def do_GET(self):
        body = BODY[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
c.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = c.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"""
# The proxy as the supervisor runs it: `secret` = 1, localhost has a secret (its TLS is
# terminated, its heads rewritten); 0, no host has one.
PROXY = """
import asyncio, ssl, sys
from pathlib import Path
from sidecar.core.layout import Layout
from sidecar.egress.allowlist import parse_list
from sidecar.egress.proxy import EgressProxy
from sidecar.egress.terminate import prepare
state, ca, port, secret = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
async def main():
    allow = parse_list("SIDECAR_EGRESS_ALLOW", [f"localhost:{port}", f"127.0.0.1:{port}"])
    kw = {}
    if secret:
        termination, _ = await prepare(Layout(state), ["localhost"], ca)
        rewrite = lambda head: head.replace(b"PLACEHOLDER", b"real-value")
        secrets = lambda host: rewrite if host == "localhost" else None
        kw = {"termination": termination, "secrets": secrets}
    proxy = EgressProxy(allow, **kw)
    await proxy.start()
    print(proxy.address[1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


def _openssl(*args: str, config: bytes = b"") -> None:
    subprocess.run(["openssl", *args], input=config, check=True, capture_output=True)


def make_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A CA standing for the public ones, and the server's certificate from it."""
    ca, ca_key, cert, key = (directory / n for n in ("ca.pem", "ca.key", "srv.pem", "srv.key"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    subj = b"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = bench\n"
    _openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
             "-config", "/dev/stdin", "-addext", "basicConstraints=critical,CA:TRUE",
             config=subj)  # fmt: skip
    csr = directory / "srv.csr"
    _openssl("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-config", "/dev/stdin",
             config=subj)  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-days",
             "2", "-out", str(cert), "-extfile", "/dev/stdin",
             config=b"subjectAltName=DNS:localhost,IP:127.0.0.1\n")  # fmt: skip
    return ca, cert, key


@contextlib.contextmanager
def process(argv: list[str]) -> Iterator[tuple[int, int]]:
    """A process that prints its port: (pid, port)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc.pid, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


class Client:
    """A kept-alive HTTPS connection through the proxy at `proxy` to `host`:`port`."""

    def __init__(self, proxy: int, host: str, port: int, context: ssl.SSLContext) -> None:
        self.conn = http.client.HTTPSConnection("127.0.0.1", proxy, context=context, timeout=30)
        self.conn.set_tunnel(host, port)

    def get(self, path: str) -> int:
        self.conn.request("GET", path, headers={"Authorization": "Bearer PLACEHOLDER"})
        with self.conn.getresponse() as response:
            return len(response.read())

    def request_ms(self, count: int) -> float:
        """The median of `count` requests' times on this connection, ms."""
        times = []
        for _ in range(count):
            start = time.perf_counter()
            self.get("/small")
            times.append((time.perf_counter() - start) * 1000)
        return sorted(times)[len(times) // 2]

    def rate(self, seconds: float) -> float:
        done, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.get("/small")
            done += 1
        return done / seconds

    def download(self) -> float:
        start = time.perf_counter()
        size = self.get("/big")
        return size / (time.perf_counter() - start) / 1e6


def run(ctx: Context) -> list[Figure]:
    scratch = ctx.scratch("tls")
    ca, cert, key = make_server_cert(scratch)
    python = [sys.executable, "-c"]
    with process([*python, SERVER, str(cert), str(key), str(BIG)]) as (_, port):
        args = [str(ca), str(port)]
        with (
            process([*python, PROXY, str(scratch / "state"), *args, "1"]) as (secret_pid, secret),
            process([*python, PROXY, str(scratch / "plain"), *args, "0"]) as (plain_pid, plain),
        ):
            context = ssl.create_default_context(cafile=scratch / "state" / "egress-ca-bundle.pem")
            terminated = Client(secret, "localhost", port, context)
            blind = Client(secret, "127.0.0.1", port, context)
            before = Client(plain, "127.0.0.1", port, context)  # a proxy without secrets
            per = ctx.pick(20, 100)
            latency = interleave(
                ctx.pick(5, 20),
                {
                    "terminated": lambda: terminated.request_ms(per),
                    "blind": lambda: blind.request_ms(per),
                    "before": lambda: before.request_ms(per),
                },
            )
            window = ctx.seconds(0.5, 2.0)
            rates = interleave(
                ctx.pick(2, 4),
                {
                    "terminated": lambda: terminated.rate(window),
                    "blind": lambda: blind.rate(window),
                },
            )
            downloads = interleave(
                ctx.pick(2, 5),
                {"terminated": terminated.download, "blind": blind.download},
            )
            with_ca = memory([psutil.Process(secret_pid)])
            without = memory([psutil.Process(plain_pid)])
    pairs = zip(latency["terminated"], latency["blind"], strict=True)
    blind_pairs = zip(latency["blind"], latency["before"], strict=True)
    return [
        Figure(
            "tls.request",
            "request to a host with a secret (TLS terminated), more than a blind tunnel (pairs)",
            "ms",
            [t - b for t, b in pairs],
            notes=f"blind median {sorted(latency['blind'])[len(latency['blind']) // 2]:.3f} ms",
            target=at_most(2.0, "≤2 ms more"),
        ),
        Figure(
            "tls.rate",
            "requests/s on one kept-alive connection, TLS terminated",
            "req/s",
            rates["terminated"],
            Baseline("blind tunnel", rates["blind"]),
            ratio_at_least(0.8, "≥0.8× blind"),
        ),
        Figure(
            "tls.download",
            "20 MB response through a terminated connection",
            "MB/s",
            downloads["terminated"],
            Baseline("blind tunnel", downloads["blind"]),
            ratio_at_least(0.8, "≥0.8× blind"),
        ),
        Figure(
            "tls.blind",
            "request through a blind tunnel, proxy with a secret set, more than one without",
            "ms",
            [b - o for b, o in blind_pairs],
            target=at_most(0.1, "no change (≤0.1 ms)"),
        ),
        Figure(
            "tls.memory",
            "proxy process with the CA loaded and a host's certificate, more than without (USS)",
            "MiB",
            [with_ca.uss - without.uss],
            target=at_most(3.0, "≤3 MiB more"),
            notes=f"with {with_ca.uss:.1f} MiB, without {without.uss:.1f} MiB",
        ),
    ]
