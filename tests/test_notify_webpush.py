"""Web Push against a loopback push service that decrypts every payload with the subscribing
browser's keys (`http_ece`) and verifies the VAPID JWT, as a real push service would (none is
reachable from these machines): subscriptions through the API, the key pair made once and kept
0600, a permission request pushed with its one-tap links and closed when answered elsewhere, a
device whose push service answers 410 forgotten, bad subscriptions refused, and the crypto
libraries loaded only once Web Push is used."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.harness import Sidecar, http, wait_for
from tests.notifytools import PushService, Seen, created, gone, public
from tests.proctools import init_of, supervisor_of
from tests.standin import HeldHook, waiting_sidecar

TOKEN = "push-admin-token-0123456789"
VIEW = "push-view-token-0123456789"
SUBSCRIPTIONS = "/notify/webpush/subscriptions"


@pytest.fixture
def push() -> Iterator[PushService]:
    service = PushService().start()
    yield service
    service.stop()


def waiting(make_sidecar: Callable[..., Sidecar], tmp: Path) -> Sidecar:
    return waiting_sidecar(
        public(make_sidecar),
        tmp,
        "make release",
        SIDECAR_NOTIFY_WEBPUSH="on",
        SIDECAR_NOTIFY_DWELL="0",
        SIDECAR_NOTIFY_COOLDOWN="0",
        SIDECAR_TOKEN=TOKEN,
        SIDECAR_VIEW_TOKEN=VIEW,
    )


def crypto_loaded(sc: Sidecar) -> bool:
    """Whether the supervisor has the `cryptography` library's native code mapped."""
    supervisor = supervisor_of(init_of(sc))
    assert supervisor is not None
    return "cryptography" in Path(f"/proc/{supervisor.pid}/maps").read_text()


def test_a_subscribed_device_gets_the_request_encrypted_and_signed_and_its_close(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, push: PushService
) -> None:
    sc = waiting(make_sidecar, short_tmp)
    # Nobody has subscribed: the first request went nowhere, and nothing loaded the crypto.
    assert sc.get("/notify/webpush").body == {"enabled": True, "devices": 0}
    assert not crypto_loaded(sc)
    key = sc.get("/notify/webpush/key").body["public_key"]
    assert crypto_loaded(sc)
    assert sc.get("/notify/webpush/key").body["public_key"] == key  # made once
    for name in ("vapid.pem", "vapid.pub"):
        assert stat.S_IMODE((sc.state_dir / name).stat().st_mode) == 0o600
    phone = push.browser("phone")
    stored = sc.post(SUBSCRIPTIONS, phone.subscription())
    assert stored.status == 201 and stored.body == {"devices": 1}
    assert stat.S_IMODE((sc.state_dir / "webpush.json").stat().st_mode) == 0o600

    HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": "make publish"}})
    (seen,) = push.wait(1, what="the push")
    assert seen.problems == [], seen.problems
    assert push.vapid_keys == {key}
    assert seen.headers["Urgency"] == "high" and seen.headers["Topic"] == seen.payload["tag"]
    msg = seen.payload
    assert msg["type"] == "show" and msg["title"] == "test-sleeve asks to use Bash"
    assert msg["body"] == "make publish" and msg["url"] == sc.url + "/"
    assert msg["actions"]["allow"].startswith(sc.url + "/a/")
    approval = next(
        a for a in sc.get("/approvals").body["approvals"] if a["summary"] == "make publish"
    )
    assert http("GET", msg["actions"]["deny"]).body["id"] == approval["id"]

    # Answered elsewhere: the device is told to close it (by its tag).
    assert sc.post(f"/approvals/{approval['id']}", {"decision": "allow"}).status == 200
    _, closing = push.wait(2, what="the close")
    assert closing.problems == [] and closing.payload == {"type": "close", "tag": msg["tag"]}
    assert closing.headers["Topic"] == msg["tag"]
    channel = sc.status()["notify"]["channels"][0]
    assert (channel["name"], channel["devices"], channel["sent"]) == ("webpush", 1, 1)


async def old_is_gone(request: web.Request, seen: Seen) -> web.StreamResponse:
    return await (gone if seen.path == "/push/old" else created)(request, seen)


def test_a_device_whose_subscription_is_gone_is_forgotten_and_the_others_still_get_it(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    service = PushService([old_is_gone]).start()
    try:
        sc = waiting(make_sidecar, short_tmp)
        old, new = service.browser("old"), service.browser("new")
        for device in (old, new):
            assert sc.post(SUBSCRIPTIONS, device.subscription()).status == 201
        HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": "deploy"}})
        pushes = service.wait(2, what="a push to each device")
        assert all(s.problems == [] for s in pushes)
        channel = wait_for(
            lambda: (c := sc.status()["notify"]["channels"][0])["devices"] == 1 and c, 10
        )
        assert channel["last"]["ok"] and "the subscription is gone and was removed" in str(
            channel["last"]["detail"]
        )
        assert old.endpoint not in (sc.state_dir / "webpush.json").read_text()
        assert new.endpoint in (sc.state_dir / "webpush.json").read_text()
    finally:
        service.stop()


def test_bad_subscriptions_are_400_and_only_the_full_token_subscribes(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, push: PushService
) -> None:
    sc = waiting(make_sidecar, short_tmp)
    good = push.browser("d").subscription()
    bad_bodies = [
        {**good, "endpoint": "http://push.example/x"},  # plain http off loopback
        {**good, "endpoint": "javascript:alert(1)"},
        {**good, "keys": {**good["keys"], "p256dh": "AAAA"}},
        {**good, "keys": {**good["keys"], "auth": good["keys"]["p256dh"]}},
        {**good, "keys": {**good["keys"], "p256dh": "not base64!"}},
        {**good, "extra": 1},
        {"endpoint": good["endpoint"]},
    ]
    for body in bad_bodies:
        reply = sc.post(SUBSCRIPTIONS, body)
        assert reply.status == 400, (body, reply.body)
    assert sc.get("/notify/webpush").body["devices"] == 0
    viewer = {"Authorization": f"Bearer {VIEW}"}
    assert sc.post(SUBSCRIPTIONS, good, headers=viewer).status == 403
    assert sc.post(SUBSCRIPTIONS, good, headers={}).status == 401
    assert sc.get("/notify/webpush", headers=viewer).status == 200
    assert sc.post(SUBSCRIPTIONS, good).status == 201
    removed = http("DELETE", sc.url + SUBSCRIPTIONS, {"endpoint": good["endpoint"]}, token=TOKEN)
    assert removed.status == 200 and removed.body == {"devices": 0}


def test_without_web_push_its_routes_are_404_and_the_worker_is_still_served(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    assert sc.get("/notify/webpush").body == {"enabled": False, "devices": 0}
    for method, path in (("GET", "/notify/webpush/key"), ("POST", SUBSCRIPTIONS)):
        reply = http(method, sc.url + path, {"endpoint": "x"} if method == "POST" else None)
        assert reply.status == 404 and "SIDECAR_NOTIFY_WEBPUSH" in reply.body["error"]
    worker = sc.get("/notify/sw.js")
    assert worker.status == 200 and worker.headers["Content-Type"].startswith("text/javascript")
    assert b"notificationclick" in worker.body
