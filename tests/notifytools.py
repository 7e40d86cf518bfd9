"""Loopback receivers for the notification tests, each checking what it gets the way the real
service defines it: a webhook receiver that verifies the signature, an ntfy stand-in that holds
requests to ntfy's HTTP publish API, and a push service that decrypts each payload with the
subscription's keys (`http_ece`) and verifies the VAPID JWT. No real receiver is reachable from
these machines (and tests talk to loopback only): this is the network seam.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from tests.aioserver import ThreadedApp
from tests.harness import Sidecar, wait_for

WEBHOOK_SECRET = "whsec-test-0123456789abcdef"
Behaviour = Callable[[web.Request, "Seen"], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    """One request a receiver got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)
    wall: float = field(default_factory=time.time)
    problems: list[str] = field(default_factory=list)  # what the checks found wrong
    payload: Any = None  # the decoded body (JSON; for a push, the decrypted JSON)
    ended: float | None = None  # when the sender hung up on a held answer

    def json(self) -> Any:
        return json.loads(self.body)


async def ok(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.json_response({"ok": True})


def status(code: int, headers: dict[str, str] | None = None) -> Behaviour:
    async def answer(request: web.Request, seen: Seen) -> web.StreamResponse:
        return web.Response(status=code, text=f"status {code}", headers=headers)

    return answer


def held(seconds: float, then: int = 200) -> Behaviour:
    """No answer for `seconds` (then `then`); `seen.ended` is when the sender hung up first."""

    async def answer(request: web.Request, seen: Seen) -> web.StreamResponse:
        try:
            await asyncio.sleep(seconds)  # sleep-ok: a receiver that takes its time
        except asyncio.CancelledError:
            seen.ended = time.monotonic()  # the client went away (handler_cancellation)
            raise
        return web.Response(status=then)

    return answer


class Receiver:
    """An aiohttp server on 127.0.0.1 in its own thread. `answers`: how the next requests are
    answered, in order (the last one stays); each request is checked by `check` first."""

    def __init__(self, answers: list[Behaviour] | None = None, host: str = "127.0.0.1") -> None:
        self.answers = list(answers or [ok])
        self.host = host
        self.url = ""
        self._seen: list[Seen] = []
        self._lock = threading.Lock()
        # A handler still holding its answer is not waited for at the end (shutdown_timeout).
        self._server = ThreadedApp(host, handler_cancellation=True, shutdown_timeout=1.0)

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def check(self, seen: Seen) -> None:
        """Look at a request as the real service would (subclasses)."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = Seen(request.method, request.path_qs, dict(request.headers), body)
        self.check(seen)
        with self._lock:
            self._seen.append(seen)
            behave = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return await behave(request, seen)

    def start(self) -> Receiver:
        app = web.Application(client_max_size=1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.url = self._server.serve(app)
        return self

    def stop(self) -> None:
        self._server.stop()

    def wait(self, count: int = 1, timeout: float = 10.0, what: str = "requests") -> list[Seen]:
        return wait_for(
            lambda: s if len(s := self.seen) >= count else None,
            timeout,
            what=lambda: f"{count} {what} at {self.url} (got {len(self.seen)})",
        )


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    """Receivers a test starts (`receivers.append(r.start())`), stopped after it."""
    made: list[Receiver] = []
    yield made
    for r in made:
        r.stop()


def public(make_sidecar: Callable[..., Sidecar]) -> Callable[..., Sidecar]:
    """`make_sidecar`, with SIDECAR_PUBLIC_URL the sidecar's own address (links point at it)."""

    def make(**kw: Any) -> Sidecar:
        sc = make_sidecar(**kw)
        sc.env_extra["SIDECAR_PUBLIC_URL"] = sc.url
        return sc

    return make


# ---- webhook -------------------------------------------------------------------------------------


class WebhookReceiver(Receiver):
    """Verifies `X-Sleeve-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "t.body">` and that `t` is
    within five minutes, as a receiver is told to."""

    def __init__(self, answers: list[Behaviour] | None = None, secret: str = WEBHOOK_SECRET):
        super().__init__(answers)
        self.secret = secret.encode()

    def check(self, seen: Seen) -> None:
        header = seen.headers.get("X-Sleeve-Signature", "")
        found = re.fullmatch(r"t=(\d+),v1=([0-9a-f]{64})", header)
        if found is None:
            seen.problems.append(f"no signature header: {header!r}")
            return
        t, mac = found.groups()
        want = hmac.new(self.secret, t.encode() + b"." + seen.body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, mac):
            seen.problems.append("signature does not verify")
        if abs(time.time() - int(t)) > 300:
            seen.problems.append(f"signature time {t} is not recent")
        if seen.headers.get("Content-Type", "").split(";")[0] != "application/json":
            seen.problems.append("not JSON")
        try:
            seen.payload = seen.json()
        except ValueError:
            seen.problems.append("body is not JSON")

    def bodies(self) -> list[dict[str, Any]]:
        return [s.payload for s in self.seen]


def secret_file(tmp: Path, secret: str = WEBHOOK_SECRET) -> Path:
    path = tmp / "webhook-secret"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    return path


def webhook_env(tmp: Path, receiver: Receiver, **extra: str) -> dict[str, str]:
    return {
        "SIDECAR_NOTIFY_WEBHOOK": receiver.url + "/hook",
        "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE": str(secret_file(tmp)),
        **extra,
    }


# ---- ntfy ----------------------------------------------------------------------------------------

NTFY_FIELDS = {
    "topic", "message", "title", "tags", "priority", "actions", "click", "attach", "markdown",
    "icon", "filename", "delay", "email", "call", "sequence_id",
}  # fmt: skip
ACTION_FIELDS = {
    "view": {"action", "label", "url", "clear"},
    "http": {"action", "label", "url", "method", "headers", "body", "clear"},
}
TOPIC = re.compile(r"[-_A-Za-z0-9]{1,64}")


class NtfyStandIn(Receiver):
    """ntfy's publish API as its documentation defines it: a JSON publish is a POST or PUT of a
    JSON object to the server's root URL with `topic` (the only required field), the others of
    the documented set and types, at most three actions (`view`: label, url; `http`: label,
    url, method, headers, body; both may `clear`); a clear is `PUT /<topic>/<sequence id>/clear`.
    Anything else is answered 400 and noted."""

    def check(self, seen: Seen) -> None:
        clear = re.fullmatch(r"/([^/]+)/([-_A-Za-z0-9]{1,64})/clear", seen.path)
        if seen.method == "PUT" and clear is not None:
            if not TOPIC.fullmatch(clear.group(1)):
                seen.problems.append(f"bad topic in {seen.path}")
            return
        if seen.method not in ("POST", "PUT") or seen.path != "/":
            where = f"{seen.method} {seen.path}"
            seen.problems.append(f"a JSON publish goes to the root URL, not {where}")
            return
        try:
            msg = seen.payload = seen.json()
        except ValueError:
            seen.problems.append("not JSON")
            return
        seen.problems += ntfy_problems(msg)


def ntfy_problems(msg: Any) -> list[str]:
    if not isinstance(msg, dict):
        return ["not an object"]
    out = [f"unknown field {k}" for k in msg if k not in NTFY_FIELDS]
    if not isinstance(msg.get("topic"), str) or not TOPIC.fullmatch(msg["topic"]):
        out.append("topic missing or not a topic name")
    for key in ("message", "title", "click", "sequence_id"):
        if key in msg and not isinstance(msg[key], str):
            out.append(f"{key} is not a string")
    if "priority" in msg and msg["priority"] not in (1, 2, 3, 4, 5):
        out.append("priority is not 1-5")
    if "tags" in msg and not (
        isinstance(msg["tags"], list) and all(isinstance(t, str) for t in msg["tags"])
    ):
        out.append("tags is not a list of strings")
    actions = msg.get("actions", [])
    if not isinstance(actions, list) or len(actions) > 3:
        return [*out, "actions is not a list of at most three"]
    for action in actions:
        kind = action.get("action") if isinstance(action, dict) else None
        allowed = ACTION_FIELDS.get(str(kind))
        if allowed is None:
            out.append(f"unknown action {kind!r}")
            continue
        out += [f"action field {k}" for k in action if k not in allowed]
        if not isinstance(action.get("label"), str) or not action["label"]:
            out.append("action without a label")
        if not str(action.get("url", "")).startswith(("http://", "https://")):
            out.append("action without an http(s) url")
    return out


async def ntfy_answer(request: web.Request, seen: Seen) -> web.StreamResponse:
    if seen.problems:
        return web.json_response({"code": 40000, "error": "; ".join(seen.problems)}, status=400)
    topic = (seen.payload or {}).get("topic") or seen.path.split("/")[1]
    return web.json_response(
        {"id": os.urandom(6).hex(), "time": int(time.time()), "event": "message", "topic": topic}
    )


# ---- Web Push ------------------------------------------------------------------------------------


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass
class Browser:
    """A subscription as a browser makes one: its P-256 key pair and auth secret."""

    endpoint: str
    key: Any = None  # cryptography's EllipticCurvePrivateKey
    auth: bytes = field(default_factory=lambda: os.urandom(16))

    def __post_init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec

        self.key = ec.generate_private_key(ec.SECP256R1())

    def subscription(self) -> dict[str, Any]:
        from cryptography.hazmat.primitives import serialization

        point = self.key.public_key().public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        return {
            "endpoint": self.endpoint,
            "expirationTime": None,
            "keys": {"p256dh": b64url(point), "auth": b64url(self.auth)},
        }


class PushService(Receiver):
    """A push service for the devices in `browsers` (by path): checks the RFC 8030 headers,
    verifies the VAPID JWT (RFC 8292: ES256 by the key in `k`, `aud` this origin, `exp` within
    24 h, a `sub`), and decrypts the RFC 8291 payload with the device's keys."""

    def __init__(self, answers: list[Behaviour] | None = None) -> None:
        super().__init__(answers or [created])
        self.browsers: dict[str, Browser] = {}
        self.vapid_keys: set[str] = set()

    def browser(self, name: str) -> Browser:
        device = Browser(f"{self.url}/push/{name}")
        self.browsers[f"/push/{name}"] = device
        return device

    def check(self, seen: Seen) -> None:
        from py_vapid import Vapid02

        h = seen.headers
        if h.get("Content-Encoding") != "aes128gcm":
            seen.problems.append(f"Content-Encoding {h.get('Content-Encoding')!r}")
        if not h.get("TTL", "").isdigit():
            seen.problems.append("no TTL")
        auth = h.get("Authorization", "")
        found = re.fullmatch(r"vapid t=([^,]+),k=([-_A-Za-z0-9]+)", auth)
        if found is None:
            seen.problems.append(f"no VAPID authorization: {auth!r}")
        else:
            token, key = found.groups()
            self.vapid_keys.add(key)
            if not Vapid02.verify(auth):
                seen.problems.append("the VAPID JWT does not verify")
            claims = json.loads(b64url_decode(token.split(".")[1]))
            if claims.get("aud") != f"{urlsplit(self.url).scheme}://{urlsplit(self.url).netloc}":
                seen.problems.append(f"aud {claims.get('aud')!r}")
            if not time.time() < claims.get("exp", 0) <= time.time() + 24 * 3600:
                seen.problems.append(f"exp {claims.get('exp')!r}")
            if not claims.get("sub"):
                seen.problems.append("no sub")
        device = self.browsers.get(seen.path)
        if device is None:
            seen.problems.append(f"no such device {seen.path}")
            return
        import http_ece

        try:
            plain = http_ece.decrypt(
                seen.body, private_key=device.key, auth_secret=device.auth, version="aes128gcm"
            )
            seen.payload = json.loads(plain)
        except Exception as exc:  # anything that does not decrypt is the finding
            seen.problems.append(f"does not decrypt: {exc!r}")

    def payloads(self, path: str | None = None) -> list[Any]:
        return [s.payload for s in self.seen if path is None or s.path == path]


async def created(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.Response(status=400 if seen.problems else 201)


async def gone(request: web.Request, seen: Seen) -> web.StreamResponse:
    return web.Response(status=410, text="push subscription has unsubscribed or expired")
