"""The dashboard's "notify me on this device" in real headless Chromium (driven over DevTools),
up to the subscription being stored, then the service worker showing and closing a push.

The browser cannot reach a real push service here (no network: `PushManager.subscribe` never
settles without one), so the page's subscribe call is answered by a stand-in subscription that
holds keys the test made for a loopback push service. Everything around it is real: the page's
permission request, the service worker's registration from the sidecar, the VAPID key it hands
the browser, the API storing the subscription, and a push that service decrypts with those keys.
The worker gets pushes from DevTools' `ServiceWorker.deliverPushMessage`, as a push service would
hand them over."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cdp import Browser
from tests.harness import Sidecar, wait_for_async
from tests.notifytools import PushService, b64url

pytestmark = pytest.mark.browser
TOKEN = "notify-dash-token-0123456789"

STAND_IN = """
(() => {
  const made = %s;
  let current = null;
  PushManager.prototype.subscribe = async function (options) {
    window.__serverKey = Array.from(new Uint8Array(options.applicationServerKey));
    current = { endpoint: made.endpoint, expirationTime: null, toJSON: () => made,
                unsubscribe: async () => { current = null; return true; } };
    return current;
  };
  PushManager.prototype.getSubscription = async function () { return current; };
})();
"""
WATCH = """
self.__shown = [];
const show = self.registration.showNotification.bind(self.registration);
self.registration.showNotification = (title, options) =>
  show(title, options).then(() => { self.__shown.push(options.tag); });
"""
SHOWN = """
navigator.serviceWorker.getRegistration('notify/')
  .then((reg) => reg.getNotifications())
  .then((list) => JSON.stringify(list.map((n) => [n.tag, n.title, n.body, n.actions.length])))
"""


@pytest.fixture
def push() -> Iterator[PushService]:
    service = PushService().start()
    yield service
    service.stop()


async def text(browser: Browser, element: str) -> str:
    return str(await browser.evaluate(f"document.getElementById('{element}').textContent"))


async def test_notify_me_registers_the_worker_and_the_subscription_is_stored(
    chromium: str, make_sidecar: Callable[..., Sidecar], push: PushService, tmp_path: Path
) -> None:
    sc = make_sidecar()
    sc.env_extra.update(SIDECAR_TOKEN=TOKEN, SIDECAR_NOTIFY_WEBPUSH="on", SIDECAR_PUBLIC_URL=sc.url)
    sc.start()
    device = push.browser("chromium")
    browser = await Browser.start(chromium, tmp_path / "profile", (1100, 800))
    try:
        await browser.call("Browser.grantPermissions", origin=sc.url, permissions=["notifications"])
        await browser.call(
            "Page.addScriptToEvaluateOnNewDocument",
            source=STAND_IN % json.dumps(device.subscription()),
        )
        await browser.call("ServiceWorker.enable")
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await wait_for_async(
            lambda: browser.evaluate("!document.getElementById('notify-me').hidden"),
            15,
            what="the notify-me button",
        )
        await browser.evaluate("document.getElementById('notify-me-on').click()")
        note = await wait_for_async(
            lambda: _notified(browser), 20, what="the page saying the device is notified"
        )
        assert note == "this device is notified (1 in all)"

        # Stored: the API, the file, the key the browser was given.
        assert sc.get("/notify/webpush").body == {"enabled": True, "devices": 1}
        assert device.endpoint in (sc.state_dir / "webpush.json").read_text()
        served = sc.get("/notify/webpush/key").body["public_key"]
        assert b64url(bytes(await browser.evaluate("window.__serverKey"))) == served
        worker = await browser.evaluate(
            "navigator.serviceWorker.getRegistration('notify/').then((r) => r.active.scriptURL)"
        )
        assert worker == f"{sc.url}/notify/sw.js"

        # A test notification reaches the device's push service, decryptable with its keys.
        assert sc.post("/notify/test").body["results"][0]["ok"]
        (seen,) = push.wait(1, what="the push")
        assert seen.problems == [] and seen.payload["title"] == "test-sleeve: test notification"

        # The worker shows what the push service hands it, and closes it when told.
        registration = _registration(browser.events)
        worker_session = await _watch_worker(browser)
        deliver: dict[str, Any] = {"origin": f"{sc.url}/", "registrationId": registration}
        shown = {**seen.payload, "actions": {"allow": f"{sc.url}/a/x", "deny": f"{sc.url}/a/y"}}
        await browser.call("ServiceWorker.deliverPushMessage", **deliver, data=json.dumps(shown))
        tag = seen.payload["tag"]
        await wait_for_async(
            lambda: browser.evaluate(f"self.__shown.includes('{tag}')", worker_session),
            10,
            what="the worker showing it",
        )
        listed = await _shown(browser)
        assert listed == [[tag, "test-sleeve: test notification", seen.payload["body"], 2]]
        close = json.dumps({"type": "close", "tag": tag})
        await browser.call("ServiceWorker.deliverPushMessage", **deliver, data=close)
        await wait_for_async(lambda: _closed(browser), 10, what="the notification closed")

        await browser.evaluate("document.getElementById('notify-me-off').click()")
        await wait_for_async(
            lambda: _says(browser, "this device is not notified"), 10, what="unsubscribed"
        )
        assert sc.get("/notify/webpush").body["devices"] == 0
    finally:
        await browser.close()


async def _notified(browser: Browser) -> str | None:
    note = await text(browser, "notify-me-note")
    if note.startswith("could not"):
        raise AssertionError(note)
    return note if note.startswith("this device is notified") else None


async def _says(browser: Browser, wanted: str) -> bool:
    return await text(browser, "notify-me-note") == wanted


async def _shown(browser: Browser) -> list[Any]:
    return list(json.loads(await browser.evaluate(SHOWN)))


async def _closed(browser: Browser) -> bool:
    return await _shown(browser) == []


async def _watch_worker(browser: Browser) -> str:
    """A DevTools session in the service worker, whose `self.__shown` lists the tags it has
    shown. The page must not list notifications while a push is being handled: Chromium drops
    from its notification database what `getNotifications()` finds stored but not yet on
    screen (seen here: the notification is then never listed), so the test waits for the
    worker's own word first."""
    targets = (await browser.call("Target.getTargets"))["targetInfos"]
    worker = next(t for t in targets if t["type"] == "service_worker")
    attached = await browser.call(
        "Target.attachToTarget", targetId=worker["targetId"], flatten=True
    )
    session = str(attached["sessionId"])
    await browser.evaluate(WATCH, session)
    return session


def _registration(events: list[dict[str, Any]]) -> str:
    for event in reversed(events):
        if event["method"] == "ServiceWorker.workerRegistrationUpdated":
            for reg in event["params"]["registrations"]:
                if reg["scopeURL"].endswith("/notify/") and not reg.get("isDeleted"):
                    return str(reg["registrationId"])
    msg = "DevTools told of no service worker registration for notify/"
    raise AssertionError(msg)
