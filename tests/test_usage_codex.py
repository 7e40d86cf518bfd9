"""The agent's bill with the real Codex CLI (0.169.0) in real tmux, offline against the loopback
Responses API stub (`tests.e2e.tool_stub`, the network seam) whose every response reports known
`usage`: its own OpenTelemetry export reaches the sidecar's receiver (the URL on its argv, the
per-launch secret only in its environment), the sidecar counts exactly what the API reported and
prices it from the table; a forged report is refused and not counted."""

from __future__ import annotations

from collections.abc import Callable

import psutil
import pytest

from sidecar.usage import prices
from sidecar.usage.reports import UsageReport
from sidecar.usage.telemetry import SECRET_HEADER
from tests.agenttools import EventLog, wait_agent
from tests.clitools import RAN, codex_sidecar, tool_stub  # tool_stub: a fixture
from tests.e2e.tool_stub import RESPONSES_USAGE
from tests.harness import Sidecar, http, wait_for
from tests.recordtools import otlp_body

__all__ = ["tool_stub"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "codex-usage-token-0123456789"
MODEL = "gpt-4.1"  # a model the price table knows (the stub answers any)


def test_a_turn_is_counted_exactly_from_codex_s_own_telemetry(
    make_sidecar: Callable[..., Sidecar], tool_stub: str
) -> None:
    """A turn with a command allowed through the API (two model responses): /status `usage`
    holds the stub's `usage` times the responses it sent, the cached tokens as cache reads, a
    cost from the price table; a `usage` event per response; the secret is in Codex's
    environment and nowhere in its argv; a forged report (a wrong secret) is 401 and not
    counted."""
    sc = codex_sidecar(make_sidecar, tool_stub, SIDECAR_TOKEN=TOKEN)
    config = sc.tmp / "home" / ".codex" / "config.toml"
    config.write_text(config.read_text().replace('model = "stub-model"', f'model = "{MODEL}"'))
    sc.start()
    events = EventLog(sc, TOKEN)
    wait_agent(sc, "idle", 60)
    assert sc.status()["usage"]["reporting"] is True
    assert sc.post("/input", {"text": "please run the command", "if_state": ["idle"]})[0] == 202
    approval = events.wait(lambda e: e["type"] == "approval-requested", "the approval", 60)
    assert sc.post(f"/approvals/{approval['id']}", {"decision": "allow"})[0] == 200
    wait_agent(sc, "idle", 60)
    assert (sc.workspace / "ran.txt").read_text() == "CODEX-RAN\n"
    assert RAN in approval["summary"]

    stub = tool_stub.removesuffix("/v1")
    turns = http("GET", f"{stub}/stub/answered")[1]["responses"]
    assert turns >= 2  # the command's call, then the answer to its result
    u = RESPONSES_USAGE
    cached = u["input_tokens_details"]["cached_tokens"]
    usage = sc.wait_status(lambda s: s["usage"]["requests"] == turns, "every response counted", 30)[
        "usage"
    ]
    assert usage["input_tokens"] == turns * (u["input_tokens"] - cached)
    assert usage["output_tokens"] == turns * u["output_tokens"]
    assert usage["cache_read_tokens"] == turns * cached
    assert usage["cache_creation_tokens"] == 0
    totals = (usage["input_tokens"], usage["output_tokens"], usage["cache_read_tokens"], 0)
    expected = prices.cost(UsageReport(MODEL, *totals, cost_usd=None))
    assert expected is not None
    assert usage["cost_usd"] > 0
    assert abs(usage["cost_usd"] - expected) < 1e-9, (usage, expected)
    counted = wait_for(
        lambda: len(found := events.of("usage")) == turns and found, 10, what="usage events"
    )
    assert {(e["cli"], e["model"], e["cost_from"]) for e in counted} == {("codex", MODEL, "prices")}

    # The secret: in its environment (which the agent can read), never on its argv.
    cli = psutil.Process(sc.status()["cli_pid"])
    header = cli.environ()["OTEL_EXPORTER_OTLP_LOGS_HEADERS"]
    name, _, secret = header.partition("=")
    assert name == SECRET_HEADER and secret
    assert not any(secret in arg for arg in cli.cmdline())
    endpoint = f"{sc.url}/telemetry/codex/v1/logs"
    assert any(endpoint in arg for arg in cli.cmdline())
    forged = otlp_body(
        {
            "event.name": "codex.sse_event",
            "event.kind": "response.completed",
            "model": MODEL,
            "input_token_count": 1_000_000,
        }
    )
    wrong = {SECRET_HEADER: "not-the-secret", "Content-Type": "application/json"}
    assert http("POST", endpoint, raw=forged, headers=wrong)[0] == 401
    assert sc.status()["usage"]["requests"] == turns
