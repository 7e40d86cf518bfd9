"""The sidecar's receiver of a CLI's usage reports (`POST /telemetry/{cli}/v1/logs`) against
forged and malformed requests, with the real Claude Code running (offline against the loopback API
stub) so that its per-launch secret and endpoint are the real ones, read from its environment as
an agent inside the sleeve could: without the secret 401, not OTLP 400, over the limit 413,
negative or impossible counts refused whole; nothing refused is counted. A report with the secret
is counted, priced by the pinned table when it has no cost; a resleeve keeps the totals and
retires the old secret."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agenttools import claude_env, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import Sidecar, http
from tests.recordtools import api_request, cli_telemetry, otlp_body

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def claude() -> Iterator[Sidecar]:
    """One sidecar with the real Claude Code for the module (its start takes seconds)."""
    stub = AnthropicStub().start()
    tmp = Path(tempfile.mkdtemp(prefix="sc-"))
    sc = Sidecar(tmp, cli="claude-code")
    try:
        sc.env_extra.update(claude_env(sc, stub))
        sc.start()
        wait_agent(sc, "idle")
        yield sc
    finally:
        sc.kill_everything()
        stub.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def send(
    sc: Sidecar, raw: bytes, headers: dict[str, str] | None = None, url: str | None = None
) -> tuple[int, Any]:
    endpoint, secret = cli_telemetry(sc)
    given = secret if headers is None else headers
    code, body = http("POST", url or endpoint, raw=raw, headers=given)
    return code, body


def counted(sc: Sidecar) -> dict[str, Any]:
    return dict(sc.status()["usage"])


def test_a_wrong_or_missing_secret_is_401_and_counts_nothing(claude: Sidecar) -> None:
    before = counted(claude)
    endpoint, secret = cli_telemetry(claude)
    [(name, value)] = secret.items()
    body = otlp_body(api_request())
    for headers in ({}, {name: value + "x"}, {name: ""}, {"Authorization": f"Bearer {value}"}):
        code, answer = send(claude, body, headers)
        assert code == 401 and "nothing was counted" in answer["error"], (headers, answer)
    other_cli = endpoint.replace("/claude-code/", "/codex/")
    assert send(claude, body, url=other_cli)[0] == 401
    assert counted(claude) == before


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"resourceLogs": {}}',
        b'{"resourceLogs": [{"scopeLogs": "x"}]}',
        b'{"resourceLogs": [{"scopeLogs": [{"logRecords": [1, 2]}]}]}',
        b"\xff\xfe",
    ],
)
def test_a_body_that_is_no_otlp_logs_request_is_400_and_counts_nothing(
    claude: Sidecar, raw: bytes
) -> None:
    before = counted(claude)
    code, answer = send(claude, raw)
    assert code == 400 and "nothing of it counted" in answer["error"], answer
    assert counted(claude) == before


def test_a_body_over_the_limit_is_413_and_counts_nothing(claude: Sidecar) -> None:
    before = counted(claude)
    padding = "x" * (10 * 1024 * 1024)
    code, answer = send(claude, otlp_body(api_request(model=padding)))
    assert code == 413, answer
    assert counted(claude) == before


@pytest.mark.parametrize(
    "bad",
    [
        {"input_tokens": -5},
        {"output_tokens": 10**12},
        {"cache_read_tokens": "12abc"},
        {"cache_creation_tokens": 1.5},
        {"cost_usd": -0.01},
        {"cost_usd": 1e9},
        {"cost_usd": "NaN"},
    ],
)
def test_negative_or_absurd_counts_refuse_the_whole_request(
    claude: Sidecar, bad: dict[str, Any]
) -> None:
    before = counted(claude)
    code, answer = send(claude, otlp_body(api_request(), api_request(**bad)))
    assert code == 400, answer
    assert "out of bounds" in answer["error"] or "is not a" in answer["error"], answer
    assert counted(claude) == before


def test_a_report_with_the_secret_is_counted_and_priced_by_the_table_without_a_cost(
    claude: Sidecar,
) -> None:
    before = counted(claude)
    no_cost = api_request(model="claude-sonnet-4-5-20250929", input_tokens=1_000_000)
    del no_cost["cost_usd"]
    unknown = api_request(model="a-model-nobody-prices", output_tokens=7)
    del unknown["cost_usd"]
    other = {"event.name": "tool_result", "input_tokens": -1}  # not a model request: ignored
    code, answer = send(claude, otlp_body(api_request(), no_cost, unknown, other))
    assert code == 200 and answer == {"partialSuccess": {}}, answer
    after = counted(claude)
    assert after["requests"] == before["requests"] + 3
    assert after["input_tokens"] == before["input_tokens"] + 100 + 1_000_000 + 100
    sonnet = after["by_model"]["claude-sonnet-4-5-20250929"]
    assert sonnet["cost_usd"] == pytest.approx(3.0 + 10 * 15.0 / 1_000_000)  # $3 / $15 per MTok
    assert after["by_model"]["a-model-nobody-prices"]["cost_usd"] == 0.0
    assert after["cost_usd"] == pytest.approx(before["cost_usd"] + 0.001 + sonnet["cost_usd"])


def test_totals_survive_a_resleeve_which_retires_the_old_secret(claude: Sidecar) -> None:
    code, _ = send(claude, otlp_body(api_request()))
    assert code == 200
    endpoint, old = cli_telemetry(claude)
    before = counted(claude)
    assert claude.post("/resleeve", {})[0] == 202
    claude.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved", 30)
    wait_agent(claude, "idle")
    _, new = cli_telemetry(claude)
    assert new != old
    assert http("POST", endpoint, raw=otlp_body(api_request()), headers=old)[0] == 401
    after = counted(claude)
    assert {k: after[k] for k in ("input_tokens", "requests", "cost_usd")} == {
        k: before[k] for k in ("input_tokens", "requests", "cost_usd")
    }
    assert after["run"]["requests"] == 0 and after["since"] == before["since"]
    assert json.dumps(after["by_model"]) == json.dumps(before["by_model"])
