"""The ntfy channel against a loopback stand-in that holds each request to ntfy's HTTP publish
API (no ntfy server is packaged for these machines): a permission request is published with
Allow and Deny `http` actions that answer it when the phone POSTs them, and cleared by its
sequence id once it is answered elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.notify.channels import Ntfy
from sidecar.notify.delivery import Http
from sidecar.notify.notice import Notice
from tests.harness import Sidecar, http
from tests.notifytools import NtfyStandIn, ntfy_answer, ntfy_problems, public
from tests.standin import waiting_sidecar


@pytest.fixture
def ntfy() -> Iterator[NtfyStandIn]:
    standin = NtfyStandIn([ntfy_answer]).start()
    yield standin
    standin.stop()


def waiting(make_sidecar: Callable[..., Sidecar], tmp: Path, ntfy: NtfyStandIn) -> Sidecar:
    token = tmp / "ntfy-token"
    token.write_text("tk_test0123456789\n")

    return waiting_sidecar(
        public(make_sidecar),
        tmp,
        "rm -rf build",
        SIDECAR_NOTIFY_NTFY=f"{ntfy.url}/sleeve_alerts-1",
        SIDECAR_NOTIFY_NTFY_TOKEN_FILE=str(token),
        SIDECAR_NOTIFY_DWELL="0.2",
    )


def test_a_request_is_published_with_actions_that_answer_it_from_the_phone(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, ntfy: NtfyStandIn
) -> None:
    sc = waiting(make_sidecar, short_tmp, ntfy)
    (seen,) = ntfy.wait(1, what="the publish")
    assert seen.problems == [], seen.problems
    assert seen.headers["Authorization"] == "Bearer tk_test0123456789"
    msg = seen.payload
    assert msg["topic"] == "sleeve_alerts-1" and msg["priority"] == 4
    assert msg["title"] == "test-sleeve asks to use Bash" and msg["message"] == "rm -rf build"
    assert msg["click"] == sc.url + "/" and msg["tags"] == ["warning"]
    allow, deny, view = msg["actions"]
    assert (allow["label"], deny["label"], view) == (
        "Allow",
        "Deny",
        {"action": "view", "label": "Open", "url": sc.url + "/"},
    )
    for action in (allow, deny):
        assert action["action"] == "http" and action["method"] == "POST" and action["clear"]
    # The phone's tap: the ntfy app sends the action's request, as it is.
    tapped = http(deny["method"], deny["url"])
    assert tapped.status == 200 and tapped.body["decision"] == "deny"
    sc.held_hook.thread.join(10)
    assert sc.held_hook.reply is not None
    assert sc.held_hook.reply.body["hookSpecificOutput"]["decision"]["behavior"] == "deny"
    assert http("POST", allow["url"]).status == 409


def test_a_request_answered_elsewhere_is_cleared_by_its_sequence_id(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, ntfy: NtfyStandIn
) -> None:
    sc = waiting(make_sidecar, short_tmp, ntfy)
    (published,) = ntfy.wait(1, what="the publish")
    approval = sc.get("/approvals").body["approvals"][0]
    assert sc.post(f"/approvals/{approval['id']}", {"decision": "allow"}).status == 200
    _, cleared = ntfy.wait(2, what="the clear")
    assert cleared.problems == []
    sequence = published.payload["sequence_id"]
    assert (cleared.method, cleared.path) == ("PUT", f"/sleeve_alerts-1/{sequence}/clear")
    assert cleared.headers["Authorization"] == "Bearer tk_test0123456789"
    (channel,) = sc.status()["notify"]["channels"]
    assert channel["name"] == "ntfy" and channel["target"] == ntfy.url
    assert channel["sent"] == 1


def test_every_kind_of_notice_is_a_valid_ntfy_publish() -> None:
    channel = Ntfy("https://ntfy.example/base/topic_1", None, Http())
    assert (channel.base, channel.topic) == ("https://ntfy.example/base", "topic_1")
    for event in ("waiting", "idle", "exited", "budget", "test"):
        msg = channel.message(Notice(event, "s", "idle", "why \u202e not"))
        assert ntfy_problems(msg) == [], (event, msg)
        assert "actions" not in msg and "click" not in msg
