"""Secrets in a real sidecar: the CLI sees only placeholders, its requests through the egress
proxy reach a listed host with the real value, and a probe CLI finds the value nowhere it can
look (every /proc environ and cmdline, every file it can open, the memory of every process it
can read). Both ways a sleeve runs: one uid for all (the restricted pod: the whole sidecar
started as an unprivileged uid) and SIDECAR_USER (root sidecar, the CLI as another user).

The far end is a loopback HTTP server that echoes the `x-api-key` it got; the listed host is
`localhost` and the unlisted one `127.0.0.1`, the same server under two names (nothing leaves
loopback)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest
import yaml

from tests.harness import Sidecar, py_cli, wait_for, write_cli_config
from tests.oneuid import GID, ONE_UID, OPEN_PYTHON, UID
from tests.proctools import restarted
from tests.tls_pki import https_stub, make_pki
from tests.webserver import Hello, web_server


@contextlib.contextmanager
def echo_server() -> Iterator[tuple[int, list[str]]]:
    """A loopback server answering each GET with the `x-api-key` it got; its port, and the
    keys it got."""
    seen: list[str] = []

    class Echo(Hello):
        def body(self) -> bytes:
            seen.append(self.headers.get("x-api-key", ""))
            return seen[-1].encode()

    with web_server(Echo) as port:
        yield port, seen


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        pytest.skip("another uid needs the tests to run as root")  # skip-ok: as test_privs


# How the sleeve runs: "uid", all as one unprivileged uid (the restricted pod); "root", all as
# root (the CLI under the guard keeps only root's file access); "user", SIDECAR_USER.
Mode = Literal["uid", "root", "user"]


def sleeve(
    make_sidecar: Callable[..., Sidecar], port: int, value: str, mode: Mode
) -> tuple[Sidecar, Path]:
    """A sidecar whose CLI is the probe, with one secret `api` (env API_KEY) listed for
    `localhost`; its value from the environment (one uid) or a root-only file (SIDECAR_USER)."""
    sc = make_sidecar(cli="probe")
    tmp = sc.tmp
    mask = secrets.token_bytes(len(value))
    masked = bytes(a ^ b for a, b in zip(value.encode(), mask, strict=True))
    report = sc.workspace / "report.json"
    urls = [f"http://localhost:{port}/", f"http://127.0.0.1:{port}/"]
    probe = py_cli("secrets_probe.py", str(report), masked.hex(), mask.hex(), *urls, str(tmp))
    write_cli_config(tmp / "clis.yaml", {"probe": probe})
    entry: dict[str, Any] = {"name": "api", "env": "API_KEY", "hosts": ["localhost"]}
    env = {
        "SIDECAR_CLI_CONFIG": str(tmp / "clis.yaml"),
        "SIDECAR_EGRESS_ALLOW": f"localhost:{port} 127.0.0.1:{port}",
        "SIDECAR_SECRETS_FILE": str(tmp / "secrets.yaml"),
    }
    sc.wrapper = list(OPEN_PYTHON)
    if mode == "user":
        (tmp / "value").write_text(value + "\n")
        (tmp / "value").chmod(0o400)
        entry["file"] = str(tmp / "value")
        env["SIDECAR_USER"] = f"{UID}:{GID}"
    else:
        entry["from_env"] = "SLEEVE_SECRET_API"
        env["SLEEVE_SECRET_API"] = value
        env["API_KEY"] = value  # also under the CLI's name: it must reach no process either
        sc.wrapper += ONE_UID if mode == "uid" else ()
    (tmp / "secrets.yaml").write_text(yaml.safe_dump({"secrets": [entry]}))
    (tmp / "secrets.yaml").chmod(0o600)  # a credential file: not the CLI's user's to read
    sc.env_extra.update(env)
    for path in (tmp.parent, tmp):
        path.chmod(0o755)  # the guard lists them as the CLI to fence the state dir
    sc.workspace.mkdir()
    os.chown(sc.workspace, UID, GID)
    if mode == "uid":
        for path in (tmp, tmp / "clis.yaml", tmp / "secrets.yaml"):
            os.chown(path, UID, GID)
    return sc, report


def sidecar_pids(sc: Sidecar) -> list[int]:
    """Init and its supervisor (a fork: the same command line)."""
    assert sc.proc is not None
    init = psutil.Process(sc.proc.pid)
    return [init.pid, *(p.pid for p in init.children() if p.cmdline() == init.cmdline())]


def check_sleeve(sc: Sidecar, report: Path, value: str, seen: list[str]) -> dict[str, Any]:
    got: dict[str, Any] = wait_for(
        lambda: json.loads(report.read_text()) if report.exists() else None,
        timeout=120,
        what=f"the probe's report (log: {sc.log_path})",
    )
    placeholder = got["env"]["API_KEY"]
    assert placeholder.startswith("sleeve-placeholder-api-")
    assert "SLEEVE_SECRET_API" not in got["env"]
    assert got["value_hits"] == [], got["value_hits"]
    # The search reads what it may: its own child's environment and memory.
    assert {h.split()[1].rsplit("/", 1)[1] for h in got["placeholder_hits"]} >= {"environ", "mem"}
    assert got["files_opened"] > 1000
    # On the wire: the real value to the listed host, the placeholder to the other.
    assert seen == [value, placeholder]
    assert got["listed_got_value"] is True
    # The CA's key is there (secrets: the proxy terminates their hosts' TLS) and out of reach:
    # root's 0700 directory with SIDECAR_USER, the guard's Landlock fence in one-uid mode.
    assert (sc.state_dir / "egress-ca" / "ca.key").is_file()
    assert got["ca_key"] == {str(sc.tmp): "EACCES"}, got["ca_key"]
    assert got["unlisted"] == placeholder
    for pid in sidecar_pids(sc):
        assert got["process_vm_readv"][str(pid)] == "EPERM", (pid, got["process_vm_readv"])
        assert pid not in got["memory_read_pids"]

    # The probe printed what the listed host echoed: no recording, screen, log or status holds
    # it (the API's answers are masked).
    def screen() -> str:
        return "\n".join(sc.get("/screen")[1]["lines"])

    wait_for(lambda: "echoed:" in screen(), timeout=10, what="the echo on the screen")
    assert "echoed: [secret:api]" in screen()
    for path in sc.tmp.rglob("*"):  # the log, the state dir, the audit trail, the recordings
        if path.is_file() and path != sc.tmp / "value":
            assert value.encode() not in path.read_bytes(), path

    def recorded() -> bytes:
        return b"".join(p.read_bytes() for p in sc.state_dir.glob("recordings/*.cast"))

    wait_for(lambda: b"echoed: [redacted]" in recorded(), timeout=10, what="the masked echo")
    _, metrics = sc.get("/metrics")
    assert 'sidecar_secret_placeholder_unlisted_total{secret="api"} 1' in metrics.decode()
    return got


@contextlib.contextmanager
def probed(
    make_sidecar: Callable[..., Sidecar], value: str, mode: Mode
) -> Iterator[tuple[Sidecar, dict[str, Any], Callable[[str], bytes]]]:
    """A running sleeve whose probe reported and passed `check_sleeve`, and how a request
    with a key reaches the listed host through its proxy (what the far end got)."""
    with echo_server() as (port, seen):
        sc, report = sleeve(make_sidecar, port, value, mode)
        sc.start()
        got = check_sleeve(sc, report, value, seen)
        assert got["uid"] == (0 if mode == "root" else UID)
        proxy = urllib.request.ProxyHandler({"http": got["env"]["HTTP_PROXY"]})

        def send(key: str) -> bytes:
            request = urllib.request.Request(
                f"http://localhost:{port}/", headers={"x-api-key": key}
            )
            with urllib.request.build_opener(proxy).open(request, timeout=10) as answer:
                return bytes(answer.read())

        yield sc, got, send
        assert sc.stop() == 0


def test_one_uid_the_probe_finds_no_value_and_the_proxy_sends_it(
    root: None, make_sidecar: Callable[..., Sidecar]
) -> None:
    """The whole sleeve as one unprivileged uid (the restricted pod): the value comes from
    the sidecar's environment, the sidecar is non-dumpable."""
    value = "sk-one-uid-" + secrets.token_hex(16)
    with probed(make_sidecar, value, "uid") as (sc, got, send):
        for pid in sidecar_pids(sc):
            assert psutil.Process(pid).uids().real == UID
            assert value.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
            # Non-dumpable: the kernel shows its /proc files as root's (whatever Yama's
            # ptrace_scope, its memory is then out of a same-uid process's reach); no core.
            assert os.stat(f"/proc/{pid}/mem").st_uid == 0
            limits = Path(f"/proc/{pid}/limits").read_text()
            assert re.search(r"Max core file size\s+0\s+0", limits), limits
        placeholder = got["env"]["API_KEY"]
        # A supervisor crash: the next one keeps the placeholder and still swaps it.
        _, supervisor = sidecar_pids(sc)
        os.kill(supervisor, signal.SIGKILL)
        restarted(sc, 1)
        kept = json.loads((sc.state_dir / "placeholders.json").read_text())
        assert kept == {"api": placeholder}
        assert send(placeholder) == value.encode()


def test_with_sidecar_user_the_probe_finds_no_value_and_the_proxy_sends_it(
    root: None, make_sidecar: Callable[..., Sidecar]
) -> None:
    """Root sidecar, the CLI as another uid: the value from a file only root can read."""
    with probed(make_sidecar, "sk-user-" + secrets.token_hex(16), "user"):
        pass


def test_all_as_root_the_probe_finds_no_value_and_the_proxy_sends_it(
    root: None, make_sidecar: Callable[..., Sidecar]
) -> None:
    """One uid, root: the guarded CLI keeps root's access to files, no capability to reach
    another process's memory."""
    with probed(make_sidecar, "sk-root-" + secrets.token_hex(16), "root"):
        pass


def test_a_value_file_the_cli_can_read_in_one_uid_mode_exits_2(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar()
    (sc.tmp / "value").write_text("sk-readable-0123456789")
    entry = {"name": "api", "env": "API_KEY", "file": str(sc.tmp / "value"), "hosts": ["x.test"]}
    (sc.tmp / "secrets.yaml").write_text(yaml.safe_dump({"secrets": [entry]}))
    sc.env_extra.update(
        SIDECAR_EGRESS_ALLOW="x.test", SIDECAR_SECRETS_FILE=str(sc.tmp / "secrets.yaml")
    )
    proc = sc.spawn()
    assert proc.wait(30) == 2
    assert f"file {sc.tmp / 'value'} is readable by the CLI" in sc.log()
    assert "sk-readable" not in sc.log()


@pytest.mark.parametrize("mode", ["root", "user"])
def test_https_to_a_listed_host_is_terminated_with_the_sleeves_ca_and_gets_the_real_value(
    root: None,
    make_sidecar: Callable[..., Sidecar],
    tmp_path_factory: pytest.TempPathFactory,
    mode: Mode,
) -> None:
    """The CLI's HTTPS request (urllib: the proxy from HTTPS_PROXY, the roots from the
    SSL_CERT_FILE the sidecar gives it; as root, or as SIDECAR_USER reading the CA's files
    through the state dir) to a listed host, its placeholder in the query: the proxy
    terminates it with the sleeve's CA and the far end — a loopback HTTPS stub signed by a test
    CA standing for the public ones, given as SIDECAR_EGRESS_CA_FILE — got the real value."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    value = f"sk-https-{mode}-" + secrets.token_hex(16)
    sc = make_sidecar(cli="probe")
    tmp = sc.tmp
    with https_stub(pki.certs["good"], tmp / "seen.jsonl") as stub:
        report = sc.workspace / "report.json"
        url = f"https://localhost:{stub.port}/v1/models?key=$API_KEY"
        write_cli_config(tmp / "clis.yaml", {"probe": py_cli("egress_probe.py", str(report), url)})
        entry: dict[str, Any] = {"name": "api", "env": "API_KEY", "hosts": ["localhost"]}
        sc.env_extra.update(
            SIDECAR_CLI_CONFIG=str(tmp / "clis.yaml"),
            SIDECAR_EGRESS_ALLOW=f"localhost:{stub.port}",
            SIDECAR_SECRETS_FILE=str(tmp / "secrets.yaml"),
            SIDECAR_EGRESS_CA_FILE=str(pki.ca),
        )
        if mode == "user":
            (tmp / "value").write_text(value + "\n")
            (tmp / "value").chmod(0o400)
            entry["file"] = str(tmp / "value")
            sc.env_extra["SIDECAR_USER"] = f"{UID}:{GID}"
        else:
            entry["from_env"] = "SLEEVE_SECRET_API"
            sc.env_extra["SLEEVE_SECRET_API"] = value
        (tmp / "secrets.yaml").write_text(yaml.safe_dump({"secrets": [entry]}))
        (tmp / "secrets.yaml").chmod(0o600)  # a credential file: not the CLI's user's to read
        sc.wrapper = list(OPEN_PYTHON)
        for path in (tmp.parent, tmp):
            path.chmod(0o755)
        sc.workspace.mkdir()
        os.chown(sc.workspace, UID, GID)
        sc.start()
        got = wait_for(
            lambda: json.loads(report.read_text()) if report.exists() else None,
            timeout=60,
            what=f"the probe's report (log: {sc.log_path})",
        )
        (answer,) = got["results"]
        assert answer[0] == 200, answer
        (request,) = stub.requests()
        assert request["path"] == f"/v1/models?key={value}"
        placeholder = json.loads((sc.state_dir / "placeholders.json").read_text())["api"]
        assert placeholder.startswith("sleeve-placeholder-api-")
        assert sc.stop() == 0
    assert "BEGIN CERTIFICATE" in (sc.state_dir / "egress-ca.pem").read_text()
    assert oct((sc.state_dir / "egress-ca" / "ca.key").stat().st_mode & 0o777) == "0o600"
    assert value not in sc.log()


def test_an_egress_ca_file_that_holds_no_certificate_exits_2(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar()
    (sc.tmp / "ca.pem").write_text("not a certificate\n")
    sc.env_extra.update(
        SIDECAR_EGRESS_ALLOW="x.test", SIDECAR_EGRESS_CA_FILE=str(sc.tmp / "ca.pem")
    )
    proc = sc.spawn()
    assert proc.wait(30) == 2
    assert (
        f"SIDECAR_EGRESS_CA_FILE: {sc.tmp / 'ca.pem'}: not a file of PEM certificates" in sc.log()
    )
