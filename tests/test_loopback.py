"""Where a local process reaches the API for each kind of bind address: the one answer the CLI's
hooks and the `sidecar` client commands share; and the free ports handed to servers that bind
them later, kept out of the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sidecar.agent.hooks import hook_base_url
from sidecar.client import SidecarClient
from sidecar.core import loopback
from sidecar.core.loopback import free_ports, loopback_url


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8080"),
        ("::", "http://[::1]:8080"),  # an IPv6 wildcard may refuse IPv4 (bindv6only)
        ("0:0::0", "http://[::1]:8080"),
        ("localhost", "http://127.0.0.1:8080"),
        ("127.0.0.1", "http://127.0.0.1:8080"),
        ("::1", "http://[::1]:8080"),
        ("fd00::5", "http://[fd00::5]:8080"),
        ("10.1.2.3", "http://10.1.2.3:8080"),
    ],
)
def test_loopback_url(host: str, url: str) -> None:
    assert loopback_url(host, 8080) == url
    assert hook_base_url(host, 8080, "claude-code") == f"{url}/hooks/claude-code/"
    env = {"SIDECAR_HOST": host, "SIDECAR_PORT": "8080"}
    assert SidecarClient.from_env(env).base_url == url


def test_the_client_defaults_to_the_contracts_port_on_loopback() -> None:
    assert SidecarClient.from_env({}).base_url == "http://127.0.0.1:8080"


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert not [p for p in ports if low <= p <= high or p < 1024]
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::1", free_ports(1, "::1")[0]))


def test_free_ports_skip_a_port_in_use_and_the_reserved_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sysctl is an OS seam: a file of our own stands in for it and reserves every port but
    # two, so that what must be picked is known.
    reserved = tmp_path / "reserved"
    monkeypatch.setattr(loopback, "RESERVED", reserved)
    a, b = sorted(free_ports(2))
    reserved.write_text(f"1024-{a - 1},{a + 1}-{b - 1},{b + 1}-65535\n")  # an empty span: none
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", a))
        assert free_ports(1) == [b]
        # No room at all: a port from the kernel after all, still a free one.
        reserved.write_text("1024-65535\n")
        (port,) = free_ports(1)
        assert port != a


@pytest.mark.parametrize("text", ["", "garbage\n", "1 2 3\n"])
def test_an_unreadable_ephemeral_range_is_taken_as_linux_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    path = tmp_path / "range"
    path.write_text(text)
    monkeypatch.setattr(loopback, "EPHEMERAL", path)
    assert not [p for p in free_ports(20) if 32768 <= p <= 60999]
