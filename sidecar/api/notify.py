"""The notifier's routes besides its links: `POST /notify/test` (what `sidecar notify test`
calls), and Web Push for the dashboard's "notify me on this device": whether it is on, the
VAPID public key, the subscriptions, and the service worker that shows the pushes.
"""

from __future__ import annotations

import asyncio
from importlib import resources

from aiohttp import web

from sidecar.api import httpio
from sidecar.api.openapi import Media, Operation
from sidecar.core.shapes import (
    NotifyTestAnswer,
    PushEndpoint,
    PushStored,
    PushSubscription,
    WebPushInfo,
    WebPushKey,
)
from sidecar.notify.service import Notifier
from sidecar.notify.webpush import Device, WebPush

JAVASCRIPT = "text/javascript"


class WebPushOff(LookupError):
    """Web Push is not on here (SIDECAR_NOTIFY_WEBPUSH): 404."""

    def __init__(self) -> None:
        super().__init__("Web Push is off here (SIDECAR_NOTIFY_WEBPUSH=on turns it on)")


def notify_operations(notifier: Notifier) -> list[Operation]:
    def webpush() -> WebPush:
        if notifier.webpush is None:
            raise WebPushOff
        return notifier.webpush

    async def test(request: web.Request) -> web.Response:
        return httpio.answer(NotifyTestAnswer(results=await notifier.test()))

    async def push_info(request: web.Request) -> web.Response:
        channel = notifier.webpush
        devices = len(channel.devices.all()) if channel is not None else 0
        return httpio.answer(WebPushInfo(enabled=channel is not None, devices=devices))

    async def push_key(request: web.Request) -> web.Response:
        # The first time, the key pair is made (the crypto library is loaded): not on the loop.
        key = await asyncio.to_thread(webpush().keys.public_key)
        return httpio.answer(WebPushKey(public_key=key), headers={"Cache-Control": "no-store"})

    async def subscribe(request: web.Request) -> web.Response:
        channel = webpush()
        body = await httpio.read_body(request, PushSubscription)
        try:
            device = Device.of(body)
        except ValueError as exc:
            raise httpio.BadRequest(f"invalid body: {exc}") from None
        return httpio.answer(PushStored(devices=channel.devices.add(device)), 201)

    async def unsubscribe(request: web.Request) -> web.Response:
        channel = webpush()
        body = await httpio.read_body(request, PushEndpoint)
        channel.devices.remove(body.endpoint)
        return httpio.answer(PushStored(devices=len(channel.devices.all())))

    async def worker(request: web.Request) -> web.Response:
        script = resources.files("sidecar.api").joinpath("static/notify-sw.js").read_bytes()
        return web.Response(
            body=script,
            content_type=JAVASCRIPT,
            charset="utf-8",
            headers={"Cache-Control": "no-cache"},
        )

    subscriptions = "/notify/webpush/subscriptions"
    off = " 404: Web Push is off here (`SIDECAR_NOTIFY_WEBPUSH`)."
    return [
        Operation(
            "POST",
            "/notify/test",
            test,
            "postNotifyTest",
            "notify",
            "Send a test notification to every channel, and say what each answered",
            {200: NotifyTestAnswer},
            description="One try per channel (no retries), all at once; at most ~10 s. No "
            "channel configured: an empty list. `sidecar notify test` calls it.",
        ),
        Operation(
            "GET",
            "/notify/webpush",
            push_info,
            "getWebPush",
            "notify",
            "Whether Web Push is offered here, and how many devices are subscribed",
            {200: WebPushInfo},
        ),
        Operation(
            "GET",
            "/notify/webpush/key",
            push_key,
            "getWebPushKey",
            "notify",
            "The VAPID public key a browser subscribes with",
            {200: WebPushKey},
            description="Made (and kept in the state dir) the first time it is asked for." + off,
            errors=(404,),
        ),
        Operation(
            "POST",
            subscriptions,
            subscribe,
            "postWebPushSubscription",
            "notify",
            "Keep a browser's push subscription: that device gets the notifications",
            {201: PushStored},
            description="The body is `PushSubscription.toJSON()`. At most 16 devices: the "
            "oldest is forgotten past that; the same endpoint again replaces it. A device "
            "whose push service answers 404 or 410 is forgotten. 400: not a subscription." + off,
            body=PushSubscription,
            errors=(400, 404),
        ),
        Operation(
            "DELETE",
            subscriptions,
            unsubscribe,
            "deleteWebPushSubscription",
            "notify",
            "Forget a device's push subscription",
            {200: PushStored},
            description=off.strip(),
            body=PushEndpoint,
            errors=(400, 404),
        ),
        Operation(
            "GET",
            "/notify/sw.js",
            worker,
            "getNotifyWorker",
            "notify",
            "The service worker that shows the pushes and answers their Allow and Deny",
            {200: Media("JavaScript", JAVASCRIPT)},
            description="Registered by the dashboard with scope `notify/`. No token needed "
            "(a browser fetches a worker without the page's headers).",
            public=True,
        ),
    ]
