"""The agent's bill and its flight recording with the real Claude Code (2.1.330) in real tmux,
offline against the loopback API stub (the network seam) whose answers report known token counts:
the sidecar counts exactly what the API reported, at the cost Claude Code computed itself, its
telemetry still reaches the user's own OTLP destination, and the recording of the session plays in
Debian's `asciinema cat` with its markers in order; a budget of a few tokens denies the next
permission request `by: budget`, holds the agent, survives a supervisor crash, and a raised
budget lets the next prompt run."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.e2e.anthropic_stub import REPLY_TEXT, AnthropicStub
from tests.harness import Sidecar, http, wait_for
from tests.notifytools import Receiver
from tests.proctools import kill_supervisor, restarted
from tests.recordtools import api_requests, asciinema_cat, markers

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "usage-admin-token-0123456789"
USAGE = {
    "input_tokens": 1234,
    "output_tokens": 200,
    "cache_read_input_tokens": 56,
    "cache_creation_input_tokens": 78,
}
COMMAND = "echo STUB-RAN | tee ran.txt"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """The user's own OTLP/HTTP destination (a loopback stand-in: the network seam)."""
    got = Receiver().start()
    yield got
    got.stop()


def claude_sidecar(
    make_sidecar: Callable[..., Sidecar], stub: AnthropicStub, **env: str
) -> Sidecar:
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub), SIDECAR_TOKEN=TOKEN, **env)
    return sc


def approve_next(sc: Sidecar, events: EventLog, seen: int) -> str:
    """Allow the permission request after the `seen` first ones; its id."""
    requested = wait_for(
        lambda: (found := events.of("approval-requested")) and len(found) > seen and found[seen],
        30,
        what=f"permission request {seen + 1}",
    )
    code, body = sc.post(f"/approvals/{requested['id']}", {"decision": "allow"})
    assert code == 200, body
    return str(requested["id"])


def metric(sc: Sidecar, name: str, **labels: str) -> float:
    text = sc.get("/metrics")[1].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    msg = f"{name}{labels} not in /metrics"
    raise AssertionError(msg)


def test_two_turns_are_counted_exactly_and_recorded_with_their_markers(
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    receiver: Receiver,
) -> None:
    """Two turns, each a permission request allowed through the API: /status `usage` holds
    exactly the stub's sums, a cost > 0 that is the sum of the costs Claude Code reported (as
    the user's own OTLP receiver got them, with the user's header), a `usage` event per request,
    the /metrics families; the recording plays in `asciinema cat` with the stub's answer and
    the markers of each turn in order."""
    stub = stub_factory(bash_command=COMMAND, usage=USAGE)
    user_telemetry = {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url + "/collector",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20users-own",
    }
    sc = claude_sidecar(make_sidecar, stub, **user_telemetry).start()
    events = EventLog(sc, TOKEN)
    wait_agent(sc, "idle")
    ids = []
    for turn in range(2):
        assert sc.post("/input", {"text": f"turn {turn}", "if_state": ["idle"]})[0] == 202
        ids.append(approve_next(sc, events, turn))
        wait_agent(sc, "idle", 60)
    assert (sc.workspace / "ran.txt").read_text() == "STUB-RAN\n"

    reported = stub.reported
    assert len(reported) == 4  # each turn: the tool call, then the answer
    usage = sc.wait_status(
        lambda s: s["usage"]["requests"] == len(reported), "every request counted"
    )["usage"]
    sums = {kind: sum(r[kind] for r in reported) for kind in USAGE}
    assert usage["input_tokens"] == sums["input_tokens"]
    assert usage["output_tokens"] == sums["output_tokens"]
    assert usage["cache_read_tokens"] == sums["cache_read_input_tokens"]
    assert usage["cache_creation_tokens"] == sums["cache_creation_input_tokens"]
    # What Claude Code reported, as the user's own destination received it (and only there).
    own = wait_for(lambda: (r := api_requests(receiver)) and len(r) == 4 and r, 20)
    assert all(seen.path == "/collector/v1/logs" for seen in receiver.seen)
    assert all(seen.headers.get("Authorization") == "Bearer users-own" for seen in receiver.seen)
    claude_cost = sum(float(r["cost_usd"]) for r in own)
    assert usage["cost_usd"] > 0
    assert math.isclose(usage["cost_usd"], claude_cost, abs_tol=1e-9), (usage, claude_cost)
    [model] = usage["by_model"]
    assert usage["by_model"][model]["requests"] == 4
    assert usage["run"]["cli"] == "claude-code" and usage["run"]["requests"] == 4
    assert usage["reporting"] is True and usage["budget"]["state"] == "none"
    seen = wait_for(lambda: (found := events.of("usage")) and len(found) == 4 and found, 10)
    assert all(e["cost_from"] == "cli" for e in seen)
    assert metric(sc, "sidecar_tokens_total", type="input", model=model) == sums["input_tokens"]
    assert math.isclose(
        metric(sc, "sidecar_cost_usd_total", model=model), claude_cost, abs_tol=1e-9
    )

    [item] = sc.get("/recordings")[1]["recordings"]
    assert item["cli"] == "claude-code" and item["ended"] is None and item["markers"] > 0
    assert sc.stop() == 0
    path = sc.state_dir / "recordings" / f"{item['id']}.cast"
    assert REPLY_TEXT in asciinema_cat(path, sc.tmp)
    labels = markers(path)
    # Per turn: working, waiting on the permission, the request and its answer, idle at last.
    for turn_id in ids:
        asked = labels.index(next(m for m in labels if m.startswith(f"approval {turn_id} req")))
        answered = labels.index(f"approval {turn_id}: allow by api")
        waiting = max(i for i, m in enumerate(labels[:asked]) if m.startswith("waiting: "))
        assert "Bash" in labels[waiting], labels
        working = max(i for i, m in enumerate(labels[:waiting]) if m == "working")
        idle = next(i for i, m in enumerate(labels) if i > answered and m == "idle")
        assert working < waiting < asked < answered < idle, labels


def test_a_spent_budget_denies_the_next_request_holds_the_agent_and_a_raise_frees_it(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """SIDECAR_BUDGET_TOKENS=150 and 110 tokens a request, two tool calls a turn: the first
    request's permission is allowed; once the second request is counted its permission request
    is denied `by: budget` with a message, the agent is `waiting` with reason `budget`, /input
    text answers 409 naming the budget; all of it survives a supervisor crash; PATCH /budget
    raises the limit and the next prompt runs."""
    stub = stub_factory(
        bash_command=COMMAND, bash_calls=2, usage={"input_tokens": 100, "output_tokens": 10}
    )
    sc = claude_sidecar(make_sidecar, stub, SIDECAR_BUDGET_TOKENS="150").start()
    events = EventLog(sc, TOKEN)
    wait_agent(sc, "idle")
    assert sc.status()["usage"]["budget"] == {
        "usd": None,
        "tokens": 150,
        "spent_usd": 0.0,
        "spent_tokens": 0,
        "state": "ok",
    }
    assert sc.post("/input", {"text": "spend it", "if_state": ["idle"]})[0] == 202
    approve_next(sc, events, 0)
    denied = events.wait(
        lambda e: e["type"] == "approval-resolved" and e.get("by") == "budget", "a budget denial"
    )
    assert denied["decision"] == "deny"
    exceeded = events.wait(lambda e: e["type"] == "budget", "the budget event")
    assert exceeded["level"] == "exceeded" and exceeded["tokens"] == 150
    assert exceeded["spent_tokens"] >= 150 and "SIDECAR_BUDGET_TOKENS" in exceeded["message"]
    agent = wait_agent(sc, "waiting")
    assert agent["reason"] == "budget"
    code, body = sc.post("/input", {"text": "go on"})
    assert code == 409 and "budget" in body["error"], body
    code, body = sc.post("/input", {"text": "go on", "if_state": ["waiting"]})
    assert code == 409 and "budget" in body["error"], body
    spent = sc.status()["usage"]

    kill_supervisor(sc)
    after = restarted(sc, 1, timeout=30)
    assert after["agent"]["state"] == "waiting" and after["agent"]["reason"] == "budget"
    assert after["usage"]["budget"]["state"] == "exceeded"
    # Nothing lost across the crash, nothing counted twice (a request the stub answered once is
    # one request); the denied tool's result still goes to the model, so a request in flight at
    # the crash may be counted after `spent` was read, by either supervisor.
    usage = after["usage"]
    assert spent["requests"] <= usage["requests"] <= len(stub.reported), (spent, usage)
    assert usage["input_tokens"] == 100 * usage["requests"], usage
    assert sc.post("/input", {"text": "go on"})[0] == 409
    events = EventLog(sc, TOKEN)  # the dead supervisor's stream ended with it

    code, body = http(
        "PATCH",
        sc.url + "/budget",
        {"tokens": 100_000},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert code == 200 and body["state"] == "ok" and body["tokens"] == 100_000, body
    wait_agent(sc, "idle", 30)
    asked = len(stub.messages_posts())
    assert sc.post("/input", {"text": "now go on", "if_state": ["idle"]})[0] == 202
    wait_for(lambda: any("now go on" in p for p in stub.prompts_seen()), 30, what="the prompt")
    assert len(stub.messages_posts()) > asked  # the model was asked again
    events.wait_states(["idle", "working"])

    def went_on() -> str | None:
        """The turn ended, or its next tool call waits for a person (not for the budget)."""
        agent = sc.status()["agent"]
        if agent["state"] == "idle":
            return "idle"
        listed = sc.get("/approvals")[1]["approvals"]
        return "asks" if agent["state"] == "waiting" and listed else None

    wait_for(went_on, 30, what="the turn to go on past the budget")
    assert sc.status()["agent"]["reason"] != "budget"


def test_budget_changes_are_checked_and_need_the_writer_token(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """PATCH /budget: a number sets, null clears, a field left out stays; zero, a string, a
    fraction of a token or an unknown field is a 400 and changes nothing; the view token gets
    403. /status and a restart of the supervisor keep what was set."""
    view = "usage-view-token-0123456789"
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": view})
    sc.env_extra["SIDECAR_BUDGET_USD"] = "2.5"
    sc.start()
    auth = {"Authorization": f"Bearer {TOKEN}"}

    def patch(body: object, headers: dict[str, str] = auth) -> tuple[int, dict]:
        code, answer = http("PATCH", sc.url + "/budget", body, headers=headers)
        return code, answer

    assert sc.status()["usage"]["budget"]["usd"] == 2.5
    for bad in ({"usd": 0}, {"usd": "1"}, {"tokens": 1.5}, {"tokens": -3}, {"euros": 1}, [1]):
        code, body = patch(bad)
        assert code == 400, (bad, body)
    assert patch({"usd": 3.0}, {"Authorization": f"Bearer {view}"})[0] == 403
    assert sc.status()["usage"]["budget"]["usd"] == 2.5
    code, body = patch({"tokens": 500})
    assert code == 200 and body["usd"] == 2.5 and body["tokens"] == 500, body
    code, body = patch({"usd": None})
    assert code == 200 and body["usd"] is None and body["tokens"] == 500, body
    kill_supervisor(sc)
    after = restarted(sc, 1)
    assert after["usage"]["budget"]["usd"] is None and after["usage"]["budget"]["tokens"] == 500
    assert after["usage"]["reporting"] is False
    assert any("reports no usage" in w for w in after["warnings"]), after["warnings"]
