"""The usage accounting's parts on their own: the pinned price table, the ledger kept in its file
(and refused when it is another run's), the budget's levels, where the user's own environment sends
a CLI's logs, and the variables that point Claude Code's logs at the sidecar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.agent.clis.claude_code import telemetry as claude
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
