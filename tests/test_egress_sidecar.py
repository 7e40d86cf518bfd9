"""Egress in a real sidecar: `SIDECAR_EGRESS_ALLOW` read once (bad values exit 2 naming the
variable), the proxy in the supervisor, its variables in the CLI's environment, /status,
/events and /metrics telling of refused attempts, and the proxy's port kept across a
supervisor crash (the adopted CLI's environment names it). Loopback only: the allowed host
is a small HTTP server on 127.0.0.1, listed as `127.0.0.1:PORT`."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.commands import run_sidecar
from tests.harness import py_cli, running_sidecar, wait_for, write_cli_config
from tests.proctools import kill_supervisor, restarted
from tests.webserver import web_server


def through_proxy(proxy: str, target: str) -> bytes:
    """What the proxy at `proxy` (host:port) answers to a GET for `target` (host:port)."""
    host, port = proxy.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SIDECAR_EGRESS_ALLOW": "https://api.anthropic.com"}, "SIDECAR_EGRESS_ALLOW: pattern"),
        ({"SIDECAR_EGRESS_ALLOW": "*"}, "bare *"),
        ({"SIDECAR_EGRESS_ALLOW": " , "}, "SIDECAR_EGRESS_ALLOW is empty; write 'none'"),
        (
            {"SIDECAR_EGRESS_ALLOW": "a.com", "SIDECAR_EGRESS_ALLOW_FILE": "/x"},
            "SIDECAR_EGRESS_ALLOW and SIDECAR_EGRESS_ALLOW_FILE are both set",
        ),
        ({"SIDECAR_EGRESS_ALLOW_FILE": "/nonexistent/allow"}, "SIDECAR_EGRESS_ALLOW_FILE: cannot"),
    ],
)
def test_a_bad_allowlist_exits_2_naming_the_variable(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    done = run_sidecar({"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", **env}, tmp_path)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_cli_reaches_listed_hosts_through_the_proxy_and_refusals_are_told(
    tmp_path: Path,
) -> None:
    # In the workspace: a guarded CLI changes nothing beside the state dir (tmp_path holds it).
    report = tmp_path / "workspace" / "report.json"
    forbidden = socket.socket()  # a port nobody listed (it never gets a connection)
    forbidden.bind(("127.0.0.1", 0))
    far = f"127.0.0.1:{forbidden.getsockname()[1]}"
    with web_server() as port, contextlib.closing(forbidden):
        allow_file = tmp_path / "allow.txt"
        allow_file.write_text(f"# the test's web server\n127.0.0.1:{port}\n*.example.com\n")
        clis = tmp_path / "clis.yaml"
        urls = [f"http://127.0.0.1:{port}/", f"http://{far}/"]
        write_cli_config(clis, {"probe": py_cli("egress_probe.py", str(report), *urls)})
        extra = {"SIDECAR_CLI_CONFIG": str(clis), "SIDECAR_EGRESS_ALLOW_FILE": str(allow_file)}
        with running_sidecar(tmp_path, cli="probe", env_extra=extra) as sc:
            sc.start()
            got = wait_for(
                lambda: json.loads(report.read_text()) if report.exists() else None,
                timeout=15,
                what="the probe's report",
            )
            env = got["env"]
            proxy = env["HTTPS_PROXY"].removeprefix("http://")
            assert proxy.startswith("127.0.0.1:")
            for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
                assert env[name] == env[name.lower()] == f"http://{proxy}"
            assert env["NO_PROXY"] == env["no_proxy"] == f"127.0.0.1:{sc.port}"
            assert env["NODE_USE_ENV_PROXY"] == "1"
            assert got["results"][0] == [200, "hello"]
            # Around the proxy, nothing: the listed host's own address included.
            assert got["direct"] == {"tcp": "EACCES", "udp": "EACCES", "ipv6": "EAFNOSUPPORT"}
            status, reason = got["results"][1]
            assert status == 403
            refused = json.loads(reason)  # a body the agent can read
            assert refused["error"] == f"{far} is not on the egress allowlist" + (
                " (SIDECAR_EGRESS_ALLOW)"
            )
            assert (refused["host"], str(refused["port"])) == tuple(far.split(":"))

            s = sc.status()
            assert s["egress"] == {
                "mode": "allowlist",
                "allow": [f"127.0.0.1:{port}", "*.example.com"],
                "denied": 4,  # the proxy refused one; the guard, TCP, UDP and IPv6
            }
            with urllib.request.urlopen(sc.url + "/events", timeout=10) as events:
                assert json.loads(events.readline())["type"] == "heartbeat"
                for _ in range(3):  # the same host three times: one event
                    assert through_proxy(proxy, "evil.example.net").startswith(b"HTTP/1.1 403")
                assert through_proxy(proxy, "other.example.net").startswith(b"HTTP/1.1 403")
                seen = [json.loads(events.readline()) for _ in range(2)]
            assert [(e["type"], e["host"], e["port"], e["how"]) for e in seen] == [
                ("egress-denied", "evil.example.net", 80, "proxy"),
                ("egress-denied", "other.example.net", 80, "proxy"),
            ]
            assert sc.log().count("egress denied: evil.example.net") == 1

            _, text = sc.get("/metrics")
            samples = [
                sample
                for family in text_string_to_metric_families(text.decode())
                for sample in family.samples
            ]
            allowed = {
                s.labels["pattern"]: s.value
                for s in samples
                if s.name == "sidecar_egress_allowed_total"
            }
            assert allowed == {f"127.0.0.1:{port}": 1, "*.example.com": 0}
            denied = [s for s in samples if s.name == "sidecar_egress_denied_total"]
            assert {s.labels["how"]: s.value for s in denied}["proxy"] == 5
            assert all(set(s.labels) == {"how"} for s in denied)

            # A supervisor crash: the next one listens on the same port (the CLI's
            # environment names it) with the same list.
            kill_supervisor(sc)
            restarted(sc, 1)
            assert through_proxy(proxy, f"127.0.0.1:{port}").endswith(b"hello")
            assert through_proxy(proxy, far).startswith(b"HTTP/1.1 403")
            assert sc.stop() == 0
