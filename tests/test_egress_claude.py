"""The real Claude Code (2.1.330) with the egress allowlist set: inside the egress guard it
reaches the API stub (listed) through the sidecar's proxy, its hooks still reach the sidecar's
API, and a permission request is answered and its command runs; nothing else is reachable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.clitools import run_dir
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, wait_for

__all__ = ["run_dir", "stub_factory"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_claude_code_works_through_the_proxy_and_only_through_it(
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
) -> None:
    # The command tries to go around the proxy: a direct connection to the stub's own address.
    stub = stub_factory(bash_command="curl -sS --noproxy '*' -m 5 $ANTHROPIC_BASE_URL/x; touch ran")
    listed = stub.url.removeprefix("http://")
    sc = make_sidecar(cli="claude-code", env_extra={"SIDECAR_EGRESS_ALLOW": listed})
    # The state dir out of /tmp, as in a sleeve: a guarded CLI can make no new entry directly in
    # a directory above it (Landlock only grants), and Claude Code makes /tmp/claude-UID at its
    # first start on a machine, exiting 1 when it cannot.
    sc.env_extra.update(claude_env(sc, stub), SIDECAR_STATE_DIR=str(run_dir()))
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle")  # its hooks reached the API (NO_PROXY names exactly it)
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]}).status == 202
    requested = events.wait(lambda e: e["type"] == "approval-requested", "approval-requested")
    assert sc.post(f"/approvals/{requested['id']}", {"decision": "allow"}).status == 200
    wait_for(lambda: (sc.workspace / "ran").exists(), 20, what="the command ran")
    wait_agent(sc, "idle")
    # The model's requests went through the proxy, allowed by the listed pattern ...
    assert stub.messages_posts()
    metrics = sc.get("/metrics").body.decode()
    allowed = next(
        line
        for line in metrics.splitlines()
        if line.startswith("sidecar_egress_allowed_total") and listed in line
    )
    assert float(allowed.rsplit(" ", 1)[1]) >= 1, allowed
    # ... and the command's direct connection was refused and told.
    denied = events.wait(
        lambda e: e["type"] == "egress-denied" and e["how"] == "direct", "egress-denied"
    )
    assert (denied["host"], denied["port"]) == ("127.0.0.1", int(listed.rsplit(":", 1)[1]))
    assert not any(r.path == "/x" for r in stub.requests)
