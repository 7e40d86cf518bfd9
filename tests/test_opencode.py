"""opencode's knowledge, pure: how it is started (its server on our port, its session by id),
what its server's events mean for the agent's state, and its permission reply's body. The
events are shaped as opencode 1.18.33 sends them (captured from its `/event` stream)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sidecar.agent.approvals import Answer
from sidecar.agent.clis import opencode
from sidecar.agent.clis.opencode import events
from sidecar.agent.registry import load_registry
from sidecar.config import ConfigError
from tests.harness import write_cli_config

SES = "ses_df12dd890ffeeQNn0UsIaVslem"
PER = "per_20ed2357a001T8VUCV2r3Mzl0W"


def ev(kind: str, **props: Any) -> dict[str, Any]:
    return {"id": "evt_20ed2357a002nNXw7KpbStmBmm", "type": kind, "properties": props}


def status(session: str, kind: str) -> dict[str, Any]:
    return ev("session.status", sessionID=session, status={"type": kind})


ASKED = ev(
    "permission.asked",
    id=PER,
    sessionID=SES,
    permission="bash",
    patterns=["touch /tmp/x"],
    metadata={"command": "touch /tmp/x"},
    always=["touch *"],
    tool={"messageID": "msg_1", "callID": "call_stub"},
)


def test_launch_argv_puts_its_server_on_our_port_and_resumes_the_pinned_session() -> None:
    server = ("--port", "4242", "--hostname", "127.0.0.1")
    assert events.launch_argv(("opencode",), host="127.0.0.1", port=4242, session_id=None) == (
        "opencode",
        *server,
    )
    resumed = events.launch_argv(
        ("opencode", "--continue", "-m", "x/y"), host="127.0.0.1", port=4242, session_id=SES
    )
    assert resumed == ("opencode", "-m", "x/y", "--session", SES, *server)
    other = events.launch_argv(
        ("opencode", "-s", "ses_old", "--session=ses_old2"),
        host="127.0.0.1",
        port=1,
        session_id=SES,
    )
    assert other[:3] == ("opencode", "--session", SES)


def test_a_turn_with_a_permission_request_reads_working_waiting_working_idle() -> None:
    turns = events.Turns()
    created = ev("session.created", sessionID=SES, info={"id": SES})
    assert turns.apply(created).state is None
    busy = turns.apply(status(SES, "busy"))
    assert (busy.state, busy.session_id) == ("working", SES)
    waiting = turns.apply(ASKED)
    assert (waiting.state, waiting.reason) == ("waiting", "bash: touch /tmp/x")
    replied = ev("permission.replied", sessionID=SES, requestID=PER, reply="once")
    assert turns.apply(replied).state == "working"
    assert turns.apply(status(SES, "busy")).session_id is None  # the same session: no news
    assert turns.apply(status(SES, "idle")).state == "idle"
    assert turns.apply(ev("server.heartbeat")).state is None


def test_a_subagents_session_keeps_the_turn_working_and_never_becomes_the_session() -> None:
    turns = events.Turns(session_id=SES)
    child = "ses_child"
    turns.apply(ev("session.created", sessionID=child, info={"id": child, "parentID": SES}))
    turns.apply(status(SES, "busy"))
    assert turns.apply(status(child, "busy")).session_id is None
    assert turns.apply(status(SES, "idle")).state == "working"  # its subagent still runs
    assert turns.apply(ev("session.idle", sessionID=child)).state == "idle"
    assert turns.session_id == SES


def test_a_question_is_waiting_and_sync_rebuilds_the_state() -> None:
    turns = events.Turns()
    question = ev("question.asked", id="que_1", sessionID=SES, questions=[{"question": "Which?"}])
    assert turns.apply(question).reason == "question: Which?"
    assert turns.apply(ev("question.rejected", sessionID=SES, requestID="que_1")).state == "idle"
    synced = turns.sync([{SES: {"type": "busy"}}, [ASKED["properties"]]])
    assert (synced.state, synced.reason) == ("waiting", "bash: touch /tmp/x")
    assert turns.sync([{SES: {"type": "idle"}}, []]).state == "idle"


def test_bad_events_say_nothing() -> None:
    turns = events.Turns()
    for bad in ({}, {"type": "session.status"}, ev("session.status"), ev("permission.asked")):
        assert turns.apply(bad).state is None
    assert events.permission_ask({"id": 3, "permission": "bash"}) is None
    assert events.replied({"requestID": PER, "reply": "maybe"}) is None


def test_replies_and_their_bodies() -> None:
    assert events.replied(ASKED["properties"] | {"requestID": PER, "reply": "always"}) == (
        PER,
        "allow",
    )
    assert events.replied({"requestID": PER, "reply": "reject"}) == (PER, "deny")
    assert events.reply_body(Answer("allow", "api")) == {"reply": "once"}
    assert events.reply_body(Answer("allow", "api", remember=True)) == {"reply": "always"}
    assert events.reply_body(Answer("deny", "api", "not that")) == {
        "reply": "reject",
        "message": "not that",
    }
    assert events.reply_body(Answer("deny", "timeout")) == {"reply": "reject"}


def test_keys_answering_its_prompt_on_screen() -> None:
    keys = opencode.CLI.screen.keys
    assert keys("allow", False) == ("Enter",)
    assert keys("allow", True) == ("Right", "Enter", "Enter")
    assert keys("deny", True) == ("Right", "Right", "Enter")


def test_the_registry_starts_opencode_with_its_events_and_refuses_them_for_others(
    tmp_path: Path,
) -> None:
    assert load_registry(None)["opencode"].state == "events"
    ok = write_cli_config(
        tmp_path / "ok.yaml", {"oc": {"command": ["/opt/bin/opencode"], "state": "events"}}
    )
    assert load_registry(ok)["oc"].state == "events"
    bad = write_cli_config(tmp_path / "bad.yaml", {"x": {"command": ["codex"], "state": "events"}})
    with pytest.raises(ConfigError, match="events needs opencode"):
        load_registry(bad)
