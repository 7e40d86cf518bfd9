"""The sleeve's egress in the supervisor (`sidecar.egress.service`) and its configuration:
the CLI's proxy variables, the one door for refused attempts with its rate limits (a clock
passed in: a minute is not waited for), and `Config` reading the two variables once."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import Config, ConfigError
from sidecar.core.events import EventBus
from sidecar.egress.allowlist import parse_list
from sidecar.egress.service import MAX_REMEMBERED, QUIET, Egress, no_proxy_with, proxy_env
from tests.harness import wait_for_async

BASE = {"SLEEVE_NAME": "s", "SLEEVE_CLI": "shell"}


def test_proxy_env_names_the_proxy_and_exactly_the_api() -> None:
    env = proxy_env(("127.0.0.1", 41000), ("0.0.0.0", 8080))
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://127.0.0.1:41000"
    assert env["NO_PROXY"] == env["no_proxy"] == "127.0.0.1:8080"
    assert proxy_env(("127.0.0.1", 1), ("::", 9000))["NO_PROXY"] == "[::1]:9000"
    assert proxy_env(("127.0.0.1", 1), ("localhost", 80))["NO_PROXY"] == "127.0.0.1:80"


def test_a_cli_server_of_its_own_is_added_to_no_proxy_by_address_and_port() -> None:
    """opencode's TUI reaches its server around the proxy: that one port, never all loopback."""
    env = proxy_env(("127.0.0.1", 41000), ("127.0.0.1", 8080))
    added = no_proxy_with(env, ("127.0.0.1", 45123))
    assert added == dict.fromkeys(("NO_PROXY", "no_proxy"), "127.0.0.1:8080,127.0.0.1:45123")
    assert env["NO_PROXY"] == "127.0.0.1:8080"  # the proxy's variables are left as they were
    assert no_proxy_with({}, ("127.0.0.1", 1))["NO_PROXY"] == "127.0.0.1:1"


def test_open_network_has_no_proxy_and_no_variables() -> None:
    egress = Egress(None, EventBus(), ("127.0.0.1", 8080))
    assert egress.mode == "open" and egress.proxy is None and egress.env() == {}
    assert (egress.info().mode, egress.info().allow) == ("open", [])


def test_denied_counts_every_attempt_and_tells_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    bus = EventBus()
    sub = bus.subscribe()
    allow = parse_list("SIDECAR_EGRESS_ALLOW", ["a.example"])
    egress = Egress(allow, bus, ("127.0.0.1", 8080), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="sidecar.egress.service"):
        for _ in range(5):
            egress.denied("evil.example", 443, "proxy")
        egress.denied("evil.example", 443, "direct")  # another how: its own event
        egress.denied("1.2.3.4", 53, "udp")
        egress.denied("x.example", 1, "bogus")  # an unknown how counts as direct
        now[0] += QUIET
        egress.denied("evil.example", 443, "proxy")  # a minute on: told again
    lines = []
    while not sub.queue.empty():
        lines.append(json.loads(sub.queue.get_nowait() or b"null"))
    assert [(e["type"], e["host"], e["port"], e["how"]) for e in lines] == [
        ("egress-denied", "evil.example", 443, "proxy"),
        ("egress-denied", "evil.example", 443, "direct"),
        ("egress-denied", "1.2.3.4", 53, "udp"),
        ("egress-denied", "x.example", 1, "direct"),
        ("egress-denied", "evil.example", 443, "proxy"),
    ]
    assert egress.denied_total == 9
    assert egress.denied_by_how == {
        "proxy": 6,
        "direct": 2,
        "udp": 1,
        "ipv6": 0,
        "raw": 0,
        "unix": 0,
    }
    assert egress.info().denied == 9
    logged = [r.getMessage() for r in caplog.records]
    assert sum("evil.example" in m for m in logged) == 2  # one per host a minute


def test_a_flood_of_names_keeps_the_limiter_bounded() -> None:
    bus = EventBus()
    egress = Egress(parse_list("V", ["a.example"]), bus, ("127.0.0.1", 1), clock=lambda: 5.0)
    for i in range(MAX_REMEMBERED * 2):
        egress.denied(f"h{i}.example", 443, "proxy")
    assert egress.denied_total == MAX_REMEMBERED * 2
    assert len(egress._events.last) <= MAX_REMEMBERED


async def test_only_the_brokers_well_formed_reports_are_denials(tmp_path: Path) -> None:
    """The broker tells of each refusal in one datagram on a real unix socket: the kernel's
    credentials say who sent it, and a datagram of any other process, or one that does not
    fit the event (a port out of range, an unknown `how`, a host that is not text), is
    dropped: nobody else can forge a refusal or flood the counts."""
    egress = Egress(parse_list("V", ["a.example"]), EventBus(), ("127.0.0.1", 1))
    path = tmp_path / "egress.sock"
    me = os.getpid()
    egress.listen_reports(path, lambda pid, uid: pid == me and uid == os.getuid())
    send = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        's.sendto(b\'{"host": "forged", "port": 1, "how": "direct"}\', sys.argv[1])\n'
    )
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b'{"host": "1.2.3.4", "port": 443, "how": "direct"}\n', str(path))
            for bad in (
                b"not json",
                b'{"host": 1, "port": "x", "how": []}',
                b'{"host": "a", "port": 70000, "how": "direct"}',
                b'{"host": "a", "port": -1, "how": "direct"}',
                b'{"host": "a", "port": true, "how": "direct"}',
                b'{"host": "a", "port": 1, "how": "teleport"}',
                b'{"host": "a\\u0000b", "port": 1, "how": "direct"}',
            ):
                s.sendto(bad, str(path))
            s.sendto(b'{"host": "::1", "port": 53, "how": "udp"}', str(path))
        subprocess.run([sys.executable, "-c", send, str(path)], check=True)
        reports = egress._reports
        assert reports is not None
        await wait_for_async(lambda: reports.dropped >= 8, 5, what="the dropped datagrams")
        await wait_for_async(lambda: egress.denied_total >= 2, 5, what="the two reports")
        assert egress.denied_by_how["direct"] == 1 and egress.denied_by_how["udp"] == 1
        assert egress.denied_total == 2
    finally:
        await egress.close()


def test_config_reads_the_variable_or_the_file_once(tmp_path: Path) -> None:
    assert Config.from_env(BASE).egress is None
    cfg = Config.from_env({**BASE, "SIDECAR_EGRESS_ALLOW": "a.example, *.b.example:8443"})
    assert cfg.egress is not None and cfg.egress.texts == ["a.example", "*.b.example:8443"]
    listed = tmp_path / "allow"
    listed.write_text("# ours\na.example # the API\n\n[::1]:9000\n")
    cfg = Config.from_env({**BASE, "SIDECAR_EGRESS_ALLOW_FILE": str(listed)})
    assert cfg.egress is not None and cfg.egress.texts == ["a.example", "[::1]:9000"]
    assert Config.from_env({**BASE, "SIDECAR_EGRESS_ALLOW": "none"}).egress == parse_list(
        "x", ["none"]
    )


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SIDECAR_EGRESS_ALLOW": ""}, "SIDECAR_EGRESS_ALLOW is empty"),
        ({"SIDECAR_EGRESS_ALLOW_FILE": ""}, "SIDECAR_EGRESS_ALLOW_FILE is empty"),
        ({"SIDECAR_EGRESS_ALLOW": "a.example", "SIDECAR_EGRESS_ALLOW_FILE": "/x"}, "both set"),
        ({"SIDECAR_EGRESS_ALLOW": "a.example/x"}, "SIDECAR_EGRESS_ALLOW: pattern 'a.example/x'"),
    ],
)
def test_config_refuses_a_bad_allowlist(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Config.from_env({**BASE, **env})


def test_config_names_the_file_and_its_bad_pattern(tmp_path: Path) -> None:
    listed = tmp_path / "allow"
    listed.write_text("a.example\n*\n")
    with pytest.raises(ConfigError, match=r"SIDECAR_EGRESS_ALLOW_FILE: pattern '\*'"):
        Config.from_env({**BASE, "SIDECAR_EGRESS_ALLOW_FILE": str(listed)})
    listed.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        Config.from_env({**BASE, "SIDECAR_EGRESS_ALLOW_FILE": str(listed)})
