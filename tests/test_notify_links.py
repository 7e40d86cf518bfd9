"""One-tap links against a real sidecar whose agent waits on a permission request (the hook
stand-in of tests/standin.py), notified to a loopback webhook receiver that verifies every
signature: the link in the notification answers the request once (`by: link`), a GET never
decides, and a replayed, truncated, foreign or pre-crash link does nothing.

Also the token format itself, in-process: what verifies, what is refused, and why."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.notify.links import LINK_TTL, Links
from tests.harness import Sidecar, http, wait_for
from tests.notifytools import WebhookReceiver, public, webhook_env
from tests.proctools import kill_supervisor, restarted
from tests.standin import waiting_sidecar

HTML = {"Accept": "text/html,application/xhtml+xml"}


# ---- the token, in-process ---------------------------------------------------------------------


def test_a_token_verifies_only_as_made_by_this_key_and_says_its_approval_and_decision() -> None:
    links = Links(b"k" * 32, generation=3)
    token = links.mint("a1b2c3d4e5f6", "deny")
    link = links.check(token)
    assert link is not None
    assert (link.approval_id, link.decision, link.generation) == ("a1b2c3d4e5f6", "deny", 3)
    assert links.current(link)
    assert time.time() + LINK_TTL - 5 < link.expires <= time.time() + LINK_TTL
    # Another key (a sidecar started anew) does not know it; no table was kept.
    assert Links(b"x" * 32, generation=3).check(token) is None


def test_a_truncated_altered_or_garbage_token_is_unknown() -> None:
    links = Links(b"k" * 32, generation=0)
    token = links.mint("a1b2c3d4e5f6", "allow")
    flipped = token[:10] + ("A" if token[10] != "A" else "B") + token[11:]
    for bad in (token[:-1], token[:-4], token[:20], flipped, token + "A", "", "!" * 40, "é" * 30):
        assert links.check(bad) is None, bad
    # The allow link cannot be made into the deny link: the decision is under the MAC.
    assert links.check(token.replace(token[4:8], "ZGVu")) is None


def test_a_link_from_an_earlier_supervisor_or_past_its_time_verifies_but_is_over() -> None:
    key = b"k" * 32
    old = Links(key, generation=0).mint("a1b2c3d4e5f6", "allow")
    now = Links(key, generation=1)
    link = now.check(old)
    assert link is not None and link.generation == 0
    assert not now.current(link)
    expired = Links(key, generation=1, ttl=-1)
    stale = expired.check(expired.mint("a1b2c3d4e5f6", "allow"))
    assert stale is not None and not expired.current(stale)


# ---- against a sidecar -------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver().start()
    yield hook
    hook.stop()


def notified(
    make_sidecar: Callable[..., Sidecar],
    tmp: Path,
    receiver: WebhookReceiver,
    command: str,
    **extra: str,
) -> tuple[Sidecar, dict[str, Any]]:
    """A sidecar waiting on `command`, and the webhook body that told of it."""
    env = webhook_env(tmp, receiver, SIDECAR_NOTIFY_DWELL="0.5", **extra)
    sc = waiting_sidecar(public(make_sidecar), tmp, command, **env)
    (seen,) = receiver.wait(1, what="the notification")
    assert seen.problems == [], seen.problems
    return sc, seen.payload


def test_the_notification_carries_links_that_answer_the_request_once(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receiver: WebhookReceiver
) -> None:
    sc, body = notified(make_sidecar, short_tmp, receiver, "touch linked.txt")
    approval_id = sc.get("/approvals").body["approvals"][0]["id"]
    assert body["type"] == "notification" and body["event"] == "waiting"
    assert body["sleeve_id"] == "test-sleeve" and body["url"] == sc.url + "/"
    assert body["agent"]["state"] == "waiting"
    approval = body["approval"]
    assert (approval["id"], approval["kind"], approval["tool"]) == (approval_id, "tool", "Bash")
    assert approval["summary"] == "touch linked.txt"
    allow, deny = approval["actions"]["allow"], approval["actions"]["deny"]
    assert allow.startswith(sc.url + "/a/") and deny.startswith(sc.url + "/a/") and allow != deny

    # A GET (a link preview) shows what the link would do and decides nothing, however often.
    for _ in range(3):
        page = http("GET", allow, headers=HTML)
        assert page.status == 200 and b"Allow this request?" in page.body
        assert b"touch linked.txt" in page.body and b'method="post"' in page.body
        assert page.headers["Referrer-Policy"] == "no-referrer"
        assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    info = http("GET", deny)
    assert info.status == 200
    said = (info.body["id"], info.body["decision"], info.body["tool"])
    assert said == (approval_id, "deny", "Bash")
    assert [a["id"] for a in sc.get("/approvals").body["approvals"]] == [approval_id]

    # The POST decides: no API token, no body.
    done = http("POST", allow)
    assert done.status == 200, done.body
    assert done.body == {"id": approval_id, "decision": "allow", "by": "link"}
    hook = sc.held_hook
    hook.thread.join(10)
    assert hook.reply is not None and hook.reply.status == 200
    assert hook.reply.body["hookSpecificOutput"]["decision"]["behavior"] == "allow"

    # Once: the same link again, or the other one, is a 409 naming the first answer.
    for again in (allow, deny):
        late = http("POST", again)
        assert late.status == 409, late.body
        assert (late.body["decision"], late.body["by"]) == ("allow", "link")
    page = http("POST", deny, headers=HTML)
    assert page.status == 409 and b"answered already: allow (by link)" in page.body
    metrics = sc.get("/metrics").body.decode()
    assert 'sidecar_approvals_decided_total{decision="allow",by="link"} 1' in metrics


def test_a_truncated_or_invented_link_is_404_and_a_link_opens_nothing_else(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receiver: WebhookReceiver
) -> None:
    """With an API token set: the link needs none, and is no token anywhere else."""
    sc, body = notified(
        make_sidecar, short_tmp, receiver, "touch never.txt", SIDECAR_TOKEN="api-token-123456789"
    )
    allow = body["approval"]["actions"]["allow"]
    for bad in (allow[:-3], allow[:-1] + ("A" if allow[-1] != "A" else "B"), sc.url + "/a/x"):
        for method in ("GET", "POST"):
            reply = http(method, bad)
            assert reply.status == 404, (bad, reply.body)
            assert reply.body == {"error": "No such link."}
    token = allow.rsplit("/", 1)[1]
    assert http("GET", f"{sc.url}/approvals?token={token}").status == 401
    assert http("GET", f"{sc.url}/approvals", token=token).status == 401
    assert http("POST", f"{sc.url}/approvals/x", {"decision": "allow"}, token=token).status == 401
    assert len(sc.get("/approvals").body["approvals"]) == 1
    assert http("GET", allow).status == 200  # no API token needed
    assert not (sc.workspace / "never.txt").exists()


def test_after_a_supervisor_crash_old_links_are_410_and_the_new_listing_gets_new_ones(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receiver: WebhookReceiver
) -> None:
    sc, body = notified(make_sidecar, short_tmp, receiver, "touch crashed.txt")
    old_allow = body["approval"]["actions"]["allow"]
    kill_supervisor(sc)
    restarted(sc, 1)
    relisted = wait_for(
        lambda: sc.get("/approvals").body["approvals"], 20, what="the request listed again"
    )
    assert relisted[0]["id"] != body["approval"]["id"]
    for method in ("GET", "POST"):
        assert http(method, old_allow).status == 410
    page = http("GET", old_allow, headers=HTML)
    assert page.status == 410 and b"no longer works" in page.body
    seen = receiver.wait(2, 20, what="the notification of the new listing")
    new = seen[-1].payload["approval"]
    assert seen[-1].problems == []
    assert new["id"] == relisted[0]["id"]
    assert new["actions"]["allow"] != old_allow
    assert http("POST", new["actions"]["deny"]).body["by"] == "link"
    assert sc.get("/approvals").body["approvals"] == []
