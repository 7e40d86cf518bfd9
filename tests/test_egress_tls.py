"""The egress proxy's TLS termination for hosts with a secret, with real clients (curl, Python's
urllib, git) as processes and an HTTPS stub process on 127.0.0.1 (named `localhost` on the
allowlist) whose certificate comes from a test CA given as SIDECAR_EGRESS_CA_FILE. The secret's
rewrite is the test's own (the real one is `sidecar.egress.secrets`'s): it puts REAL where the
placeholder is, and inside Basic credentials too. Nothing leaves loopback."""

from __future__ import annotations

import asyncio
import base64
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.egress.proxy import EgressProxy
from tests.tls_pki import PLACEHOLDER, REAL, Pki, Rig, Stub, https_stub, make_pki, rig, run
from tests.tools import require_executable


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    require_executable("openssl", "Debian's openssl package (ca-certificates depends on it)")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def good(pki: Pki, tmp_path: Path) -> Iterator[Stub]:
    with https_stub(pki.certs["good"], tmp_path / "seen.jsonl") as stub:
        yield stub


def header(request: dict[str, object], name: str) -> list[str]:
    headers = request["headers"]
    assert isinstance(headers, list)
    return [v for k, v in headers if k.lower() == name.lower()]


async def test_curl_to_a_host_with_a_secret_carries_the_real_value(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [good.port]) as r:
        url = f"https://localhost:{good.port}/v1/one?key={PLACEHOLDER.decode()}"
        status, out = await run(
            [curl, "-sS", "--fail-with-body", "-H", f"X-Api-Key: {PLACEHOLDER.decode()}", url],
            r.env,
        )
        assert status == 0, out
        assert out == f"seen GET /v1/one?key={REAL.decode()}\n"
    (seen,) = good.requests()
    assert header(seen, "X-Api-Key") == [REAL.decode()]
    (record,) = r.records
    assert (record.host, record.port, record.allowed, record.reason) == (
        "localhost",
        good.port,
        True,
        None,
    )
    assert record.bytes_out > 0 and record.bytes_in > 0


async def test_urllib_trusts_the_sleeve_ca_through_ssl_cert_file(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    script = (
        "import sys, urllib.request as u\n"
        "r = u.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]})\n"
        "print(u.urlopen(r, timeout=20).read().decode(), end='')\n"
    )
    async with rig(pki, tmp_path, [good.port]) as r:
        url = f"https://localhost:{good.port}/py"
        status, out = await run([sys.executable, "-c", script, url, PLACEHOLDER.decode()], r.env)
    assert (status, out) == (0, "seen GET /py\n")
    assert header(good.requests()[0], "Authorization") == [f"Bearer {REAL.decode()}"]


async def test_a_host_without_a_secret_is_a_blind_tunnel_and_the_placeholder_goes_unchanged(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    """127.0.0.1 is allowed but has no secret: the client sees the far end's own certificate
    (the test CA's, which no sleeve CA issued) and the placeholder arrives as it was sent."""
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [good.port]) as r:
        url = f"https://127.0.0.1:{good.port}/blind"
        status, out = await run(
            [curl, "-sS", "-w", "%{certs}", "--cacert", str(pki.ca),
             "-H", f"X-Api-Key: {PLACEHOLDER.decode()}", url], r.env,
        )  # fmt: skip
    assert status == 0, out
    assert "Issuer:CN = test" in out.replace(" = ", " = ")  # the stub's own certificate
    assert header(good.requests()[0], "X-Api-Key") == [PLACEHOLDER.decode()]


async def test_a_client_that_does_not_trust_the_sleeve_ca_sends_nothing_and_is_recorded(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    """A tool with roots of its own (here curl given the test CA alone, not the bundle) refuses
    the proxy's certificate: its request never leaves, and the record says why."""
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [good.port]) as r:
        args = [curl, "-sS", "--cacert", str(pki.ca), "-H", f"X-Api-Key: {PLACEHOLDER.decode()}",
                f"https://localhost:{good.port}/x"]  # fmt: skip
        status, out = await run(args, r.env)
    assert status != 0 and "certificate" in out, out
    assert good.requests() == []
    (record,) = r.records
    assert record.reason is not None and "does it trust the sleeve's CA?" in record.reason


async def test_three_requests_on_one_connection_are_each_rewritten(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [good.port]) as r:
        urls = [f"https://localhost:{good.port}/{n}" for n in range(3)]
        args = [curl, "-sS", "-H", f"X-Api-Key: {PLACEHOLDER.decode()}", *urls]
        status, out = await run(args, r.env)
        assert status == 0, out
    assert [req["path"] for req in good.requests()] == ["/0", "/1", "/2"]
    assert all(header(req, "X-Api-Key") == [REAL.decode()] for req in good.requests())
    assert len(r.records) == 1  # one CONNECT carried all three


async def test_a_chunked_body_with_the_placeholder_passes_unchanged(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    curl = require_executable("curl")
    body = b"start " + PLACEHOLDER * 3000 + b" end"  # several chunks, split across reads
    (tmp_path / "body").write_bytes(body)
    async with rig(pki, tmp_path, [good.port]) as r:
        args = [curl, "-sS", "-H", "Transfer-Encoding: chunked", "-H", "Expect: 100-continue",
                "-H", f"X-Api-Key: {PLACEHOLDER.decode()}", "--data-binary",
                f"@{tmp_path / 'body'}", f"https://localhost:{good.port}/post",
                f"https://localhost:{good.port}/after"]  # fmt: skip
        status, out = await run(args, r.env)
        assert status == 0, out
    assert len(good.requests()) == 2, out
    posted, after = good.requests()
    assert posted["method"] == "POST" and posted["body"] == body.decode()
    assert header(posted, "X-Api-Key") == [REAL.decode()]
    assert after["path"] == "/after" and header(after, "X-Api-Key") == [REAL.decode()]


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("self-signed", "self-signed certificate"),
        ("expired", "certificate has expired"),
        ("wrong-name", "Hostname mismatch"),
    ],
)
async def test_an_upstream_with_an_invalid_certificate_gets_the_client_a_502_with_the_reason(
    pki: Pki, tmp_path: Path, kind: str, why: str
) -> None:
    curl = require_executable("curl")
    with https_stub(pki.certs[kind], tmp_path / "seen.jsonl") as stub:
        async with rig(pki, tmp_path, [stub.port]) as r:
            args = [curl, "-sS", "-w", "%{http_code}", "-H", f"X-Api-Key: {PLACEHOLDER.decode()}",
                    f"https://localhost:{stub.port}/x"]  # fmt: skip
            status, out = await run(args, r.env)
        assert stub.requests() == []  # nothing was sent to it
    assert status == 0, out
    assert out.endswith("502"), out
    assert f"the certificate of localhost:{stub.port} is not valid" in out and why in out, out
    (record,) = r.records
    assert record.allowed is False and record.reason is not None and why in record.reason


async def test_git_push_over_https_with_only_the_placeholder(pki: Pki, tmp_path: Path) -> None:
    """The loopback git server asks for the token as Basic auth's password; git has only the
    placeholder, in an http.extraHeader, and trusts the sleeve's CA through GIT_SSL_CAINFO."""
    git = require_executable("git")
    repos = tmp_path / "repos"
    subprocess.run([git, "init", "-q", "--bare", str(repos / "r.git")], check=True)
    subprocess.run([git, "-C", str(repos / "r.git"), "config", "http.receivepack", "true"],
                   check=True)  # fmt: skip
    work = tmp_path / "work"
    subprocess.run([git, "init", "-q", "-b", "main", str(work)], check=True)
    (work / "f").write_text("x\n")
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([git, "-C", str(work), "add", "f"], check=True)
    subprocess.run([git, "-C", str(work), *ident, "commit", "-qm", "one"], check=True)
    basic = base64.b64encode(b"sleeve:" + PLACEHOLDER).decode()
    with https_stub(pki.certs["good"], tmp_path / "seen.jsonl", (repos, REAL.decode())) as stub:
        async with rig(pki, tmp_path, [stub.port]) as r:
            env = r.env | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
            args = [git, "-c", f"http.extraHeader=Authorization: Basic {basic}", "push",
                    f"https://localhost:{stub.port}/git/r.git", "main"]  # fmt: skip
            status, out = await run(args, env, cwd=work)
    assert status == 0, out
    pushed = subprocess.run([git, "-C", str(repos / "r.git"), "rev-parse", "main"],
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    head = subprocess.run([git, "-C", str(work), "rev-parse", "HEAD"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert pushed == head
    assert REAL.decode() not in (work / ".git" / "config").read_text()


@pytest.fixture
def plain(tmp_path: Path) -> Iterator[Stub]:
    with https_stub(None, tmp_path / "plain.jsonl") as stub:
        yield stub


async def ended(r: Rig) -> None:
    """Once a connection's record is written (its client gone, its far end closing after)."""
    async with asyncio.timeout(10):
        while not r.records:
            await asyncio.sleep(0.01)  # sleep-ok: polling for the record, bounded above


def tunnelled(curl: str, proxy: EgressProxy, *args: str) -> list[str]:
    """curl sending its http:// requests through a CONNECT tunnel (`--proxytunnel`), as Gemini
    CLI's proxy client does."""
    return [curl, "-sS", "-p", "-x", f"http://127.0.0.1:{proxy.address[1]}", *args]


async def test_plain_http_inside_a_connect_carries_the_real_value_on_each_request(
    pki: Pki, plain: Stub, tmp_path: Path
) -> None:
    """Two plain requests on one tunnel to a host with a secret: each head rewritten, the body
    as it was sent, and the answers as the stub wrote them."""
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [plain.port]) as r:
        urls = [f"http://localhost:{plain.port}/{n}?key={PLACEHOLDER.decode()}" for n in (1, 2)]
        args = tunnelled(curl, r.proxy, "-H", f"X-Api-Key: {PLACEHOLDER.decode()}",
                         "--data-binary", PLACEHOLDER.decode(), *urls)  # fmt: skip
        status, out = await run(args, r.env)
        assert status == 0, out
        await ended(r)
    assert out == "".join(f"seen POST /{n}?key={REAL.decode()}\n" for n in (1, 2))
    assert [header(req, "X-Api-Key") for req in plain.requests()] == [[REAL.decode()]] * 2
    assert [req["body"] for req in plain.requests()] == [PLACEHOLDER.decode()] * 2
    (record,) = r.records  # one CONNECT carried both
    assert (record.allowed, record.reason) == (True, None)


async def test_tls_and_plain_http_tunnels_to_one_host_with_a_secret_both_work(
    pki: Pki, plain: Stub, good: Stub, tmp_path: Path
) -> None:
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [plain.port, good.port]) as r:
        key = ["-H", f"X-Api-Key: {PLACEHOLDER.decode()}"]
        done = await run(tunnelled(curl, r.proxy, *key, f"http://localhost:{plain.port}/p"), r.env)
        assert done == (0, "seen GET /p\n")
        done = await run(tunnelled(curl, r.proxy, *key, f"https://localhost:{good.port}/t"), r.env)
        assert done == (0, "seen GET /t\n")
    assert header(plain.requests()[0], "X-Api-Key") == [REAL.decode()]
    assert header(good.requests()[0], "X-Api-Key") == [REAL.decode()]


async def test_a_plain_request_for_another_host_inside_the_tunnel_is_refused(
    pki: Pki, plain: Stub, tmp_path: Path
) -> None:
    """The tunnel was opened to localhost: a request in it naming another host (which a far
    end serving several would answer) never gets the secret; it is answered 400."""
    curl = require_executable("curl")
    async with rig(pki, tmp_path, [plain.port]) as r:
        args = tunnelled(curl, r.proxy, "-w", "%{http_code}", "-H", "Host: elsewhere.example",
                         "-H", f"X-Api-Key: {PLACEHOLDER.decode()}",
                         f"http://localhost:{plain.port}/x")  # fmt: skip
        status, out = await run(args, r.env)
    assert (status, out[-3:]) == (0, "400"), out
    assert "is not the host this connection was opened to" in out
    assert plain.requests() == []


async def test_a_client_silent_in_its_tunnel_is_closed_and_recorded(
    pki: Pki, plain: Stub, tmp_path: Path
) -> None:
    """A CONNECT to a host with a secret, answered, then nothing but the close: the far end
    gets nothing, the record says the client sent nothing."""
    async with rig(pki, tmp_path, [plain.port]) as r:
        reader, writer = await asyncio.open_connection(*r.proxy.address)
        writer.write(f"CONNECT localhost:{plain.port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.close()
        await writer.wait_closed()
        await ended(r)
    assert plain.requests() == []
    (record,) = r.records
    assert record.reason is not None and "sent nothing" in record.reason


async def test_megabytes_both_ways_pass_whole_through_a_terminated_connection_and_are_counted(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    """A body and its echo, each many times what the proxy reads at once: every byte arrives,
    in order, both ways, and the record counts them."""
    curl = require_executable("curl")
    body = bytes(range(256)) * (12 * 1024)  # 3 MiB
    (tmp_path / "body").write_bytes(body)
    async with rig(pki, tmp_path, [good.port]) as r:
        args = [curl, "-sS", "-o", str(tmp_path / "echo"), "-H",
                f"X-Api-Key: {PLACEHOLDER.decode()}", "--data-binary", f"@{tmp_path / 'body'}",
                f"https://localhost:{good.port}/echo"]  # fmt: skip
        status, out = await run(args, r.env)
        assert status == 0, out
        await ended(r)
    assert (tmp_path / "echo").read_bytes() == body
    (posted,) = good.requests()
    assert header(posted, "X-Api-Key") == [REAL.decode()]
    (record,) = r.records
    assert record.bytes_out > len(body) and record.bytes_in > len(body)


async def test_closing_the_proxy_ends_an_idle_terminated_connection_at_once_and_records_it(
    pki: Pki, good: Stub, tmp_path: Path
) -> None:
    """A kept-alive terminated connection, idle after its request (its thread waiting on both
    sockets): the proxy's close ends it within a second, the client sees the end, and its
    record is there when the close returns."""
    async with rig(pki, tmp_path, [good.port]) as r:
        reader, writer = await asyncio.open_connection(*r.proxy.address)
        writer.write(f"CONNECT localhost:{good.port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        trust = ssl.create_default_context(cafile=r.env["SSL_CERT_FILE"])
        await writer.start_tls(trust, server_hostname="localhost")
        writer.write(f"GET /one HTTP/1.1\r\nHost: localhost:{good.port}\r\n\r\n".encode())
        assert (await reader.readuntil(b"seen GET /one\n")).startswith(b"HTTP/1.1 200")
        async with asyncio.timeout(1):
            await r.proxy.close()
            assert await reader.read() == b""
        (record,) = r.records
        assert record.allowed and record.bytes_in > 0
        writer.close()
