"""The webhook and ntfy channels: a signed JSON POST, and an ntfy publish (JSON to the server's
root URL, as ntfy's publish API defines it) whose approvals carry Allow and Deny buttons."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any

from sidecar import __version__
from sidecar.notify.delivery import Channel, Http, Result, target_of
from sidecar.notify.notice import Notice

log = logging.getLogger(__name__)

USER_AGENT = f"sleeve-sidecar/{__version__}"
SIGNATURE = "X-Sleeve-Signature"
# ntfy shows a tag that names an emoji as that emoji.
NTFY_TAGS = {"waiting": "hourglass", "idle": "white_check_mark", "exited": "stop_sign"}


def signature(secret: bytes, body: bytes, now: float | None = None) -> str:
    """`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`: a receiver checks the MAC and
    that `t` is recent (a replayed body carries an old `t`)."""
    t = str(int(time.time() if now is None else now))
    mac = hmac.new(secret, t.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


class Webhook(Channel):
    name = "webhook"

    def __init__(self, url: str, secret: str, http: Http) -> None:
        super().__init__(target_of(url), http)
        self.url = url
        self._secret = secret.encode()

    def _headers(self, notice: Notice, body: bytes) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "X-Sleeve-Event": notice.event,
            "X-Sleeve-Delivery": notice.id,  # the same on a retry: a receiver may drop repeats
            SIGNATURE: signature(self._secret, body),
        }

    async def attempt(self, notice: Notice) -> Result:
        body = notice.webhook_body()
        # Signed at each attempt: a retry carries the time it was sent at.
        return await self.http.send("POST", self.url, body, self._headers(notice, body))


class Ntfy(Channel):
    """`topic_url`: https://ntfy.example/<topic>; `token`: an ntfy access token, if the topic
    needs one. A withdrawal clears the notification by its sequence id (ntfy 2.16 and later;
    an older server answers an error, and the notification stays until it is dismissed)."""

    name = "ntfy"

    def __init__(self, topic_url: str, token: str | None, http: Http) -> None:
        super().__init__(target_of(topic_url), http)
        self.base, self.topic = topic_url.rstrip("/").rsplit("/", 1)
        self._headers = {"User-Agent": USER_AGENT}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def message(self, notice: Notice) -> dict[str, Any]:
        """The JSON publish of ntfy's API for `notice`."""
        tag = "warning" if notice.approval is not None else NTFY_TAGS.get(notice.event, "bell")
        msg: dict[str, Any] = {
            "topic": self.topic,
            "title": notice.title,
            "message": notice.body,
            "priority": 4 if notice.urgent or notice.event == "exited" else 3,
            "tags": [tag],
            "sequence_id": notice.id,
        }
        actions: list[dict[str, Any]] = []
        links = notice.actions()
        if links is not None:
            # `http` actions: the ntfy app POSTs the link itself, a one-tap answer; `clear`
            # dismisses the notification once the sidecar answered 2xx.
            for decision, label in (("allow", "Allow"), ("deny", "Deny")):
                actions.append(
                    {
                        "action": "http",
                        "label": label,
                        "url": links[decision],
                        "method": "POST",
                        "clear": True,
                    }
                )
        if notice.url is not None:
            msg["click"] = notice.url
            actions.append({"action": "view", "label": "Open", "url": notice.url})
        if actions:
            msg["actions"] = actions
        return msg

    async def attempt(self, notice: Notice) -> Result:
        body = json.dumps(self.message(notice)).encode()
        headers = {**self._headers, "Content-Type": "application/json"}
        return await self.http.send("POST", f"{self.base}/", body, headers)

    async def withdraw(self, notice: Notice) -> None:
        url = f"{self.base}/{self.topic}/{notice.id}/clear"
        result = await self.http.send("PUT", url, None, self._headers)
        if not result.ok:
            log.info("ntfy: notification %s not cleared: %s", notice.id, result.detail)
