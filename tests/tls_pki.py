"""Certificates for the egress proxy's TLS tests, made with the `openssl` command line: a test
CA standing for the public ones (given to the proxy as SIDECAR_EGRESS_CA_FILE), and the far
ends' certificates, good and bad; the HTTPS stub (`tests.tls_stub`) as a process; and a proxy
with a secret for localhost (`rig`), with a client process beside it (`run`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.audit.records import EgressConnectionRecord
from sidecar.core.layout import Layout
from sidecar.egress.allowlist import parse_list
from sidecar.egress.proxy import EgressProxy
from sidecar.egress.terminate import prepare

ROOT = Path(__file__).resolve().parent.parent
CONFIG = b"[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = test\n"


def openssl(*args: str, config: bytes = CONFIG) -> None:
    subprocess.run(["openssl", *args], input=config, check=True, capture_output=True)


@dataclass(frozen=True)
class Pki:
    """`ca`: the test CA's certificate; `certs[kind]`: (cert, key) of a far end, where `kind`
    is `good` (localhost and 127.0.0.1, by the test CA), `expired`, `wrong-name` (another
    host), `self-signed`."""

    ca: Path
    certs: dict[str, tuple[Path, Path]]


def make_pki(directory: Path) -> Pki:
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", str(ca_key), "-out", str(ca), "-days", "30", "-config", "/dev/stdin",
            "-addext", "basicConstraints=critical,CA:TRUE")  # fmt: skip
    certs = {}
    for kind, san, days, signer in (
        ("good", "DNS:localhost,IP:127.0.0.1", "30", "ca"),
        ("expired", "DNS:localhost", "-1", "ca"),
        ("wrong-name", "DNS:other.example", "30", "ca"),
        ("self-signed", "DNS:localhost", "30", "self"),
    ):
        cert, key, csr = (directory / f"{kind}.{ext}" for ext in ("pem", "key", "csr"))
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", str(key), "-out", str(csr), "-config", "/dev/stdin")  # fmt: skip
        sign = ["-CA", str(ca), "-CAkey", str(ca_key)] if signer == "ca" else ["-signkey", str(key)]
        openssl("x509", "-req", "-in", str(csr), *sign, "-days", days, "-out", str(cert),
                "-extfile", "/dev/stdin", config=f"subjectAltName={san}\n".encode())  # fmt: skip
        certs[kind] = (cert, key)
    return Pki(ca, certs)


@dataclass(frozen=True)
class Stub:
    port: int
    seen: Path  # one JSON line per request it read

    def requests(self) -> list[dict[str, object]]:
        if not self.seen.exists():
            return []
        return [json.loads(line) for line in self.seen.read_text().splitlines()]


@contextlib.contextmanager
def https_stub(
    cert: tuple[Path, Path] | None, seen: Path, git: tuple[Path, str] | None = None
) -> Iterator[Stub]:
    """The HTTPS stub serving `cert` on 127.0.0.1 (None: plain HTTP; with `git`: its
    repositories and the token its git server asks for), until the block ends."""
    pair = [str(cert[0]), str(cert[1])] if cert is not None else ["-", "-"]
    argv = [sys.executable, "-m", "tests.tls_stub", *pair, str(seen)]
    if git is not None:
        argv += [str(git[0]), git[1]]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # its port, once it listens
        assert line.strip().isdigit(), f"the stub did not start: {line!r}"
        yield Stub(int(line), seen)
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


PLACEHOLDER = b"sleeve-placeholder-4f9c2d"
REAL = b"real-value-81d0e7"
BASIC = re.compile(rb"(Authorization: Basic )([A-Za-z0-9+/=]+)")


def rewrite(head: bytes) -> bytes:
    """The placeholder replaced by the real value, in the head and in Basic credentials."""

    def basic(match: re.Match[bytes]) -> bytes:
        decoded = base64.b64decode(match.group(2)).replace(PLACEHOLDER, REAL)
        return match.group(1) + base64.b64encode(decoded)

    return BASIC.sub(basic, head.replace(PLACEHOLDER, REAL))


@dataclass
class Rig:
    proxy: EgressProxy
    env: dict[str, str]  # a client's: the proxy and the trust variables, nothing else
    records: list[EgressConnectionRecord] = field(default_factory=list)


@contextlib.asynccontextmanager
async def rig(pki: Pki, tmp: Path, ports: list[int]) -> AsyncIterator[Rig]:
    """The proxy allowing localhost and 127.0.0.1 on `ports`, with a secret for localhost."""
    # The test CA goes in as a corporate CA would (SIDECAR_EGRESS_CA_FILE): the proxy trusts
    # it upstream, and the blind tunnel's client trusts it through the bundle.
    termination, trust = await prepare(Layout(tmp / "state"), ["localhost"], pki.ca)
    allow = [f"{h}:{p}" for p in ports for h in ("localhost", "127.0.0.1")]
    records: list[EgressConnectionRecord] = []
    proxy = EgressProxy(
        parse_list("SIDECAR_EGRESS_ALLOW", allow),
        secrets=lambda host: rewrite if host == "localhost" else None,
        termination=termination,
        on_closed=records.append,
    )
    await proxy.start()
    url = f"http://127.0.0.1:{proxy.address[1]}"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "HTTPS_PROXY": url, "https_proxy": url}
    env |= trust
    try:
        yield Rig(proxy, env, records)
    finally:
        await proxy.close()


async def run(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> tuple[int, str]:
    """A client process, while the proxy serves in this loop: its status and output."""
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 15)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")
