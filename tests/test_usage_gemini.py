"""The agent's bill with the real Gemini CLI (0.61.0) in real tmux, offline against the loopback
Gemini API stub (`tests.e2e.tool_stub`, the network seam) whose every turn reports known
`usageMetadata`: its own OpenTelemetry export reaches the sidecar's receiver with the per-launch
secret, the sidecar counts exactly what the API reported and prices it from the table; its traces
and metrics are taken and dropped; a forged report is refused and not counted.

Gemini reads the sidecar's hook settings only from root's directories: the state dir is under
/run, as in tests/test_agent_gemini.py."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.usage import prices
from sidecar.usage.reports import UsageReport
from sidecar.usage.telemetry import SECRET_HEADER
from tests.agenttools import EventLog, wait_agent
from tests.clitools import gemini_sidecar, run_dir, stub_for  # run_dir, stub_for: fixtures
from tests.e2e.tool_stub import GEMINI_USAGE
from tests.harness import Sidecar, http, wait_for
from tests.recordtools import otlp_body

__all__ = ["run_dir", "stub_for"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "gemini-usage-token-0123456789"
COMMAND = "echo GEMINI-RAN > ran.txt"


def telemetry_of(sc: Sidecar) -> tuple[str, dict[str, str]]:
    """Where the running Gemini CLI exports to and the headers it sends, read from its
    environment (the test runs as the CLI's user, as an agent inside the sleeve could)."""
    env = psutil.Process(sc.status()["cli_pid"]).environ()
    headers = dict(h.split("=", 1) for h in env["OTEL_EXPORTER_OTLP_LOGS_HEADERS"].split(","))
    return env["GEMINI_TELEMETRY_OTLP_ENDPOINT"], headers


def api_response(**counts: Any) -> dict[str, Any]:
    """A `gemini_cli.api_response` record as Gemini CLI sends one."""
    return {
        "event.name": "gemini_cli.api_response",
        "model": "gemini-2.5-pro",
        "input_token_count": 10,
        "output_token_count": 1,
        **counts,
    }


def test_a_turn_is_counted_exactly_from_gemini_s_own_telemetry(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """A turn with a shell call (two model requests): /status `usage` holds the stub's
    `usageMetadata` times the turns it answered, the cached tokens as cache reads, thoughts as
    output, a cost > 0 from the price table; a `usage` event per request; a forged report (a
    wrong secret) is 401 and not counted; traces and metrics with the secret are taken."""
    stub = stub_for(COMMAND)
    sc = gemini_sidecar(make_sidecar, stub, run_dir(), SIDECAR_TOKEN=TOKEN).start()
    events = EventLog(sc, TOKEN)
    wait_agent(sc, "idle", 60)
    assert sc.status()["usage"]["reporting"] is True
    assert sc.post("/input", {"text": "please run it", "if_state": ["idle"]})[0] == 202
    # As long as the other tests of this turn wait, and the screen shown if it never comes.
    assert wait_agent(sc, "waiting")["reason"] == f"Shell: {COMMAND}"
    assert sc.post("/input", {"keys": ["1"], "if_state": ["waiting"]})[0] == 202
    wait_agent(sc, "idle")
    assert (sc.workspace / "ran.txt").read_text() == "GEMINI-RAN\n"

    turns = http("GET", f"{stub}/stub/answered")[1]["gemini"]
    assert turns == 2  # the shell call, then the answer to its result
    usage = sc.wait_status(
        lambda s: s["usage"]["requests"] >= turns and s["usage"]["output_tokens"] == turns * 230,
        "every turn counted",
    )["usage"]
    u = GEMINI_USAGE
    assert usage["input_tokens"] == turns * (
        u["promptTokenCount"] - u["cachedContentTokenCount"] + u["toolUsePromptTokenCount"]
    )
    assert usage["output_tokens"] == turns * (u["candidatesTokenCount"] + u["thoughtsTokenCount"])
    assert usage["cache_read_tokens"] == turns * u["cachedContentTokenCount"]
    assert usage["cache_creation_tokens"] == 0
    # Priced from the table, at Gemini's default model (its router's side requests, which the
    # stub answers without usage, are counted at 0 tokens under their own model).
    [(model, main)] = [(m, c) for m, c in usage["by_model"].items() if c["output_tokens"]]
    assert model == "gemini-3.1-pro-preview"
    totals = (usage["input_tokens"], usage["output_tokens"], usage["cache_read_tokens"], 0)
    expected = prices.cost(UsageReport(model, *totals, cost_usd=None))
    assert expected is not None
    assert usage["cost_usd"] > 0
    assert math.isclose(main["cost_usd"], expected, abs_tol=1e-9), (main, expected)
    counted = wait_for(
        lambda: (
            len(found := [e for e in events.of("usage") if e["output_tokens"]]) == turns and found
        ),
        10,
        what="a usage event per turn",
    )
    assert {e["cost_from"] for e in counted} == {"prices"}, counted
    assert all(e["cli"] == "gemini-cli" for e in counted)

    # The agent can read the CLI's environment; a report with any other secret is refused.
    endpoint, headers = telemetry_of(sc)
    forged = otlp_body(api_response(output_token_count=1_000_000))
    wrong = {SECRET_HEADER: "not-the-secret", "Content-Type": "application/json"}
    assert http("POST", f"{endpoint}/v1/logs", raw=forged, headers=wrong)[0] == 401
    # Its traces and metrics with the secret: taken (and dropped); a bad one: 400.
    json_headers = {**headers, "Content-Type": "application/json"}
    for signal, key in (("traces", "resourceSpans"), ("metrics", "resourceMetrics")):
        body = json.dumps({key: []}).encode()
        assert http("POST", f"{endpoint}/v1/{signal}", raw=body, headers=json_headers)[0] == 200
        assert http("POST", f"{endpoint}/v1/{signal}", raw=b"[1]", headers=json_headers)[0] == 400
        assert http("POST", f"{endpoint}/v1/{signal}", raw=body, headers=wrong)[0] == 401
    after = sc.status()["usage"]
    assert (after["output_tokens"], after["requests"]) == (
        usage["output_tokens"],
        usage["requests"],
    )
