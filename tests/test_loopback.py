"""Where a local process reaches the API for each kind of bind address: the one answer the CLI's
hooks and the `sidecar` client commands share."""

from __future__ import annotations

import pytest

from sidecar.agent.hooks import hook_base_url
from sidecar.client import SidecarClient
from sidecar.core.loopback import loopback_url


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
