"""The usage accounting's parts on their own: the pinned price table, the ledger kept in its file
(and refused when it is another run's), the budget's levels, where the user's own environment sends
a CLI's logs, the variables and arguments that point Claude Code's, Gemini CLI's and Codex's
telemetry at the sidecar, their usage records (the real CLIs are in test_usage_*), and opencode's
model requests read from its events (as measured on 1.18.33; the real one is in
test_agent_opencode)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.agent.clis.claude_code import telemetry as claude
from sidecar.agent.clis.codex import telemetry as codex
from sidecar.agent.clis.gemini_cli import telemetry as gemini
from sidecar.agent.clis.opencode.usage import Bill
from sidecar.usage import budget, prices
from sidecar.usage.ledger import Ledger
from sidecar.usage.reports import BadReport, UsageReport, count, dollars
from sidecar.usage.telemetry import TelemetryLaunch, otlp_logs_destination

INIT = (1234, 56.78)


def report(model: str = "m", cost: float | None = 0.5, **n: int) -> UsageReport:
    counts = {"input": 10, "output": 2, "cache_read": 0, "cache_creation": 0, **n}
    return UsageReport(model, cost_usd=cost, **counts)


def test_the_table_prices_by_the_longest_prefix_and_knows_what_it_does_not_know() -> None:
    assert prices.price_of("claude-opus-4-5-20251101") == prices.PRICES["claude-opus-4-5"]
    assert prices.price_of("claude-opus-4-1-20250805") == prices.PRICES["claude-opus-4"]
    assert prices.price_of("openai/GPT-5-mini") == prices.PRICES["gpt-5-mini"]
    assert prices.price_of("a-model-of-tomorrow") is None
    priced = prices.cost(report("gemini-2.5-pro", None, input=1_000_000, output=100_000))
    assert priced == pytest.approx(1.25 + 1.0)


def test_counts_and_costs_are_checked() -> None:
    assert count("42", "n") == 42 and count(7.0, "n") == 7
    for bad in (-1, 10**8, 1.5, "1e3", None, True):
        with pytest.raises(BadReport):
            count(bad, "n")
    assert dollars("0.25", "c") == 0.25
    for bad in (-0.1, float("nan"), float("inf"), 10_000, "x", None):
        with pytest.raises(BadReport):
            dollars(bad, "c")


def test_the_ledger_keeps_its_counts_for_the_same_init_only(tmp_path: Path) -> None:
    path = tmp_path / "usage.json"
    ledger = Ledger(path, INIT, 5.0, None)
    ledger.new_run("claude-code")
    assert ledger.add(report()) == (0.5, "cli")
    assert ledger.add(report("claude-haiku-4-5", None, input=1_000_000)) == (
        pytest.approx(1.0 + 2 * 5 / 1_000_000),
        "prices",
    )
    assert ledger.add(report("nobody-knows", None)) == (0.0, "unknown")
    assert path.stat().st_mode & 0o777 == 0o600
    again = Ledger(path, INIT, 5.0, None).record
    assert again.totals.requests == 3 and again.run is not None and again.run.requests == 3
    assert sorted(again.by_model) == ["claude-haiku-4-5", "m", "nobody-knows"]
    assert Ledger(path, (1234, 99.0), 5.0, None).record.totals.requests == 0  # another init
    path.write_text("{broken")
    assert Ledger(path, INIT, None, None).record.totals.requests == 0


def test_a_budget_changed_through_the_api_wins_over_the_environment_after_a_crash(
    tmp_path: Path,
) -> None:
    path = tmp_path / "usage.json"
    ledger = Ledger(path, INIT, 5.0, None)
    assert (ledger.record.budget.usd, ledger.record.budget.changed) == (5.0, False)
    ledger.record.budget.usd, ledger.record.budget.changed = 9.0, True
    ledger.save()
    assert Ledger(path, INIT, 5.0, None).record.budget.usd == 9.0
    data = json.loads(path.read_text())
    data["budget"]["changed"] = False
    path.write_text(json.dumps(data))
    assert Ledger(path, INIT, 5.0, 100).record.budget.tokens == 100


def test_many_model_names_are_bounded(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "usage.json", INIT, None, None)
    for n in range(100):
        ledger.add(report(f"forged-{n}"))
    assert len(ledger.record.by_model) == 65 and ledger.record.by_model["other"].requests == 36


@pytest.mark.parametrize(
    ("usd", "tokens", "spent", "level"),
    [
        (None, None, (99.0, 99), "none"),
        (10.0, None, (7.9, 0), "ok"),
        (10.0, None, (8.0, 0), "warning"),
        (10.0, 1000, (1.0, 1000), "exceeded"),
        (None, 1000, (0.0, 850), "warning"),
    ],
)
def test_levels(usd: float | None, tokens: int | None, spent: tuple, level: str) -> None:
    assert budget.level(budget.spent_share(usd, tokens, *spent)) == level


def test_the_users_own_logs_destination_is_read_as_the_sdk_reads_it() -> None:
    assert otlp_logs_destination({}) is None
    assert otlp_logs_destination({"OTEL_LOGS_EXPORTER": "console"}) is None
    plain = otlp_logs_destination({"OTEL_LOGS_EXPORTER": "otlp"})
    assert plain is not None and plain.url == "http://localhost:4318/v1/logs"
    env = {
        "OTEL_LOGS_EXPORTER": "console,otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.example:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b,x=1",
    }
    found = otlp_logs_destination(env)
    assert found is not None and found.url == "https://collector.example:4318/v1/logs"
    assert found.headers == {"api-key": "a b", "x": "1"}
    logs = {**env, "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://logs.example/in"}
    assert otlp_logs_destination(logs).url == "http://logs.example/in"  # type: ignore[union-attr]
    assert otlp_logs_destination({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None


def test_claude_codes_logs_go_to_the_sidecar_and_its_users_settings_are_kept() -> None:
    user = {"OTEL_LOGS_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "otlp"}
    added = claude.launch(TelemetryLaunch("http://127.0.0.1:1/telemetry/x/v1/logs", "s3cret", user))
    assert added["OTEL_LOGS_EXPORTER"] == "console,otlp"
    assert added["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] == "X-Sidecar-Telemetry=s3cret"
    assert added["OTEL_EXPORTER_OTLP_LOGS_PROTOCOL"] == "http/json"
    assert not any(
        k.startswith("OTEL_METRICS") or k == "OTEL_EXPORTER_OTLP_ENDPOINT" for k in added
    )
    assert claude.destination(user) is None  # its telemetry was off: nothing to relay
    assert claude.read({"event.name": "user_prompt"}) is None


def test_gemini_exports_everything_to_the_sidecar_with_the_secret() -> None:
    user = {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=users-own"}
    endpoint = "http://127.0.0.1:1/telemetry/gemini-cli/v1/logs"
    added = gemini.launch(TelemetryLaunch(endpoint, "s3cret", user))
    assert added["GEMINI_TELEMETRY_OTLP_ENDPOINT"] == "http://127.0.0.1:1/telemetry/gemini-cli"
    assert added["GEMINI_TELEMETRY_OTLP_PROTOCOL"] == "http"
    for signal in ("LOGS", "TRACES", "METRICS"):
        assert added[f"OTEL_EXPORTER_OTLP_{signal}_HEADERS"] == "X-Sidecar-Telemetry=s3cret"
    assert added["GEMINI_TELEMETRY_OUTFILE"] == ""  # beats a settings file's outfile


def test_gemini_s_usage_records_are_read_as_the_api_bills_them() -> None:
    record = {
        "event.name": "gemini_cli.api_response",
        "model": "gemini-3.1-pro-preview",
        "input_token_count": 1234,
        "cached_content_token_count": "56",  # int64 in OTLP JSON may come as a string
        "tool_token_count": 7,
        "output_token_count": 200,
        "thoughts_token_count": 30,
    }
    got = gemini.read(record)
    assert got == UsageReport("gemini-3.1-pro-preview", 1185, 230, 56, 0, None)
    assert got.tokens == 1234 + 7 + 200 + 30  # Gemini's total_token_count
    assert gemini.read({**record, "event.name": "gemini_cli.api_request"}) is None
    with pytest.raises(BadReport, match="more than input_token_count"):
        gemini.read({**record, "cached_content_token_count": 2000})
    with pytest.raises(BadReport, match="thoughts_token_count -1"):
        gemini.read({**record, "thoughts_token_count": -1})
    with pytest.raises(BadReport, match="output tokens"):
        gemini.read({**record, "output_token_count": 10_000_000})


def test_gemini_s_own_destination_is_read_from_its_variables() -> None:
    on = {
        "GEMINI_TELEMETRY_ENABLED": "true",
        "GEMINI_TELEMETRY_OTLP_PROTOCOL": "http",
        "GEMINI_TELEMETRY_OTLP_ENDPOINT": "https://collector.example/otlp/",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=1,b=2",
        "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "b=3",
    }
    found = gemini.destination(on)
    assert found is not None and found.url == "https://collector.example/otlp/v1/logs"
    assert found.headers == {"a": "1", "b": "3"}
    general = {k: v for k, v in on.items() if k != "GEMINI_TELEMETRY_OTLP_ENDPOINT"}
    general["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://c"
    assert gemini.destination(general).url == "http://c/v1/logs"  # type: ignore[union-attr]
    # Set but empty, Gemini's own variable still wins: no endpoint, nothing exported.
    assert gemini.destination({**general, "GEMINI_TELEMETRY_OTLP_ENDPOINT": ""}) is None
    for off in (
        {"GEMINI_TELEMETRY_ENABLED": "yes"},  # Gemini's own parser: only "true" and "1"
        {"GEMINI_TELEMETRY_OTLP_PROTOCOL": "grpc"},
        {"GEMINI_TELEMETRY_TARGET": "gcp"},
        {"GEMINI_TELEMETRY_OUTFILE": "/tmp/t.json"},
        {"GEMINI_TELEMETRY_OTLP_ENDPOINT": "file:///x"},
    ):
        assert gemini.destination({**on, **off}) is None, off


def test_codex_gets_the_url_on_its_argv_and_the_secret_in_its_environment() -> None:
    start = TelemetryLaunch("http://127.0.0.1:1/telemetry/codex/v1/logs", "s3cret", {})
    assert codex.args(start) == (
        "-c",
        'otel.exporter={otlp-http={endpoint="http://127.0.0.1:1/telemetry/codex/v1/logs",'
        'protocol="json"}}',
    )
    assert codex.launch(start) == {"OTEL_EXPORTER_OTLP_LOGS_HEADERS": "X-Sidecar-Telemetry=s3cret"}


def test_codex_s_completed_responses_are_read_as_the_api_bills_them() -> None:
    record = {
        "event.name": "codex.sse_event",
        "event.kind": "response.completed",
        "model": "gpt-4.1",
        "input_token_count": "1234",  # as Codex 0.169 sends it: a string
        "output_token_count": "200",
        "cached_token_count": "56",
        "cache_write_token_count": "0",
        "reasoning_token_count": "30",  # inside the output count
    }
    assert codex.read(record) == UsageReport("gpt-4.1", 1178, 200, 56, 0, None)
    counted_twice = {k: v for k, v in record.items() if "token" not in k}
    assert codex.read(counted_twice) is None  # its copy of the event without counts
    assert codex.read({**record, "event.kind": "response.created"}) is None
    with pytest.raises(BadReport, match="more than input_token_count"):
        codex.read({**record, "cached_token_count": 2000})
    with pytest.raises(BadReport, match="output_token_count"):
        codex.read({**record, "output_token_count": "-5"})


def test_codex_s_own_destination_is_read_from_its_config(tmp_path: Path) -> None:
    env = {"CODEX_HOME": str(tmp_path)}
    assert codex.destination(env) is None  # no config at all
    config = tmp_path / "config.toml"
    config.write_text(
        '[otel]\nexporter = { otlp-http = { endpoint = "https://c.example/v1/logs", '
        'protocol = "binary", headers = { "x-key" = "k1" } } }\n'
    )
    found = codex.destination(env)
    assert found is not None and found.url == "https://c.example/v1/logs"
    assert found.headers == {"x-key": "k1"}
    for other in (
        '[otel]\nexporter = "none"\n',
        "not toml [",
        '[otel]\nexporter = { otlp-grpc = { endpoint = "http://c" } }\n',
    ):
        config.write_text(other)
        assert codex.destination(env) is None, other


def _message(msg: str, model: str, role: str = "assistant") -> dict[str, object]:
    info = {"id": msg, "role": role, "modelID": model, "providerID": "p", "cost": 0}
    return {"type": "message.updated", "properties": {"info": info}}


def _step(part: str, msg: str, cost: object = 0, **tokens: object) -> dict[str, object]:
    counts = {"input": 1, "output": 1, "reasoning": 0, "cache": {"write": 0, "read": 0}}
    body = {"id": part, "messageID": msg, "type": "step-finish", "reason": "stop", "cost": cost}
    return {
        "type": "message.part.updated",
        "properties": {"part": {**body, "tokens": counts | tokens}},
    }


def test_opencodes_step_finishes_are_its_model_requests_each_counted_once() -> None:
    """A step-finish part is one request: its model is its message's; reasoning is billed as
    output; cache reads and writes are kept apart; a cost of 0 (no price in opencode's
    catalogue) leaves the pricing to the table; the same part sent again is not counted twice;
    a count no request has is refused."""
    bill = Bill()
    assert bill.read(_message("msg_1", "claude-sonnet-4-5")) is None
    assert bill.read({"type": "session.idle", "properties": {}}) is None
    cache = {"read": 300, "write": 40}
    first = bill.read(_step("prt_1", "msg_1", 0, input=7, output=5, reasoning=3, cache=cache))
    assert first == UsageReport("claude-sonnet-4-5", 7, 8, 300, 40, None)
    assert bill.read(_step("prt_1", "msg_1", 0, input=7)) is None  # sent again
    priced = bill.read(_step("prt_2", "msg_1", 0.0125))
    assert priced is not None and priced.cost_usd == 0.0125
    unknown = bill.read(_step("prt_3", "msg_gone"))
    assert unknown is not None and unknown.model == "unknown"
    with pytest.raises(BadReport):
        bill.read(_step("prt_4", "msg_1", input=-1))
    with pytest.raises(BadReport):
        bill.read(_step("prt_5", "msg_1", cost=5000))
