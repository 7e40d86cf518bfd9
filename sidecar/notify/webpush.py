"""Web Push (RFC 8030): the devices people subscribed from the dashboard, the VAPID key pair
(RFC 8292) made once and kept in the state dir, and the channel that encrypts each payload for
each device (RFC 8291, by `pywebpush`) and signs the request (`py-vapid`).

The crypto libraries cost ~14 MiB of memory, so they are imported the first time a key is made
or a push is sent, never at start: a sidecar whose dashboard nobody subscribed pays nothing.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sidecar.core.files import read_regular, write_new
from sidecar.core.shapes import PushSubscription
from sidecar.notify.delivery import Channel, Http, Result, with_retries
from sidecar.notify.notice import Notice

if TYPE_CHECKING:
    from py_vapid import Vapid02

log = logging.getLogger(__name__)

MAX_DEVICES = 16  # past that, the oldest subscription is forgotten
MAX_FILE = 256 * 1024
TTL = 3600  # seconds a push service keeps a message for a device that is offline
JWT_LIFE = 12 * 3600


def _b64decode(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)


@dataclass(frozen=True)
class Device:
    """One browser's push subscription."""

    endpoint: str
    p256dh: str  # the browser's P-256 public key, base64url
    auth: str  # its 16-byte auth secret, base64url

    @classmethod
    def of(cls, sub: PushSubscription) -> Device:
        """The subscription a browser sent, checked (ValueError says what is wrong)."""
        parts = urlsplit(sub.endpoint)
        local = parts.scheme == "http" and _loopback(parts.hostname or "")
        if parts.scheme != "https" and not local:
            msg = "`endpoint` must be an https:// URL (http:// only on a loopback address)"
            raise ValueError(msg)
        if not parts.hostname or any(c.isspace() or not c.isprintable() for c in sub.endpoint):
            msg = "`endpoint` is not a URL with a host"
            raise ValueError(msg)
        try:
            key, auth = _b64decode(sub.keys.p256dh), _b64decode(sub.keys.auth)
        except (binascii.Error, ValueError):
            msg = "`keys.p256dh` and `keys.auth` must be base64url"
            raise ValueError(msg) from None
        if len(key) != 65 or key[0] != 4:
            msg = "`keys.p256dh` must be an uncompressed P-256 point (65 bytes)"
            raise ValueError(msg)
        if len(auth) != 16:
            msg = "`keys.auth` must be 16 bytes"
            raise ValueError(msg)
        return cls(sub.endpoint, sub.keys.p256dh, sub.keys.auth)

    def info(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "keys": {"p256dh": self.p256dh, "auth": self.auth}}


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


class Devices:
    """The subscriptions, kept in the state dir (0600) across restarts. A file that cannot be
    read as ours is taken as empty (and replaced at the next subscription), never an error."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._devices = self._load()

    def _load(self) -> list[Device]:
        raw = read_regular(self.path, MAX_FILE)
        if raw is None:
            return []
        try:
            items = json.loads(raw)
            return [Device(**item) for item in items][-MAX_DEVICES:]
        except (ValueError, TypeError):
            log.warning("%s is not a list of subscriptions; starting with none", self.path)
            return []

    def _save(self) -> None:
        data = json.dumps([asdict(d) for d in self._devices]).encode()
        write_new(self.path, data, 0o600)

    def all(self) -> list[Device]:
        return list(self._devices)

    def add(self, device: Device) -> int:
        self._devices = [d for d in self._devices if d.endpoint != device.endpoint]
        self._devices.append(device)
        del self._devices[:-MAX_DEVICES]
        self._save()
        return len(self._devices)

    def remove(self, endpoint: str) -> bool:
        kept = [d for d in self._devices if d.endpoint != endpoint]
        if len(kept) == len(self._devices):
            return False
        self._devices = kept
        self._save()
        return True


class VapidKeys:
    """The application server's key pair: the private key as PEM (0600), the public one beside
    it as base64url text, so that handing it to a browser imports nothing."""

    def __init__(self, key: Path, public: Path, subject: str) -> None:
        self.key_path = key
        self.public_path = public
        self.subject = subject  # the `sub` claim: the sidecar's public origin
        self._signer: Vapid02 | None = None
        self._making = threading.Lock()  # two first requests must not make two pairs

    def public_key(self) -> str:
        """The public key, made (with the private one) the first time (blocking: call it in a
        thread)."""
        with self._making:
            known = read_regular(self.public_path, 1024)
            if known is not None and read_regular(self.key_path, 4096) is not None:
                return known.decode().strip()
            return self._make()

    def _make(self) -> str:
        from cryptography.hazmat.primitives import serialization
        from py_vapid import Vapid02

        vapid = Vapid02()
        vapid.generate_keys()
        write_new(self.key_path, vapid.private_pem(), 0o600)
        point = vapid.public_key.public_bytes(
            serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
        )
        public = base64.urlsafe_b64encode(point).rstrip(b"=").decode()
        write_new(self.public_path, public.encode(), 0o600)
        self._signer = None
        log.info("Web Push: made the VAPID key pair in %s", self.key_path)
        return public

    def headers(self, endpoint: str) -> dict[str, str]:
        """The `Authorization: vapid t=<JWT>,k=<key>` header for a push to `endpoint`."""
        if self._signer is None:
            from py_vapid import Vapid02

            self.public_key()  # made if missing
            pem = read_regular(self.key_path, 4096)
            if pem is None:
                msg = f"cannot read {self.key_path}"
                raise OSError(msg)
            self._signer = Vapid02.from_pem(pem)
            self._signer.conf = {"no-strict": True}  # `sub` is the public URL's origin as it is
        parts = urlsplit(endpoint)
        claims = {
            "sub": self.subject,
            "aud": f"{parts.scheme}://{parts.netloc}",
            "exp": int(time.time()) + JWT_LIFE,
        }
        return dict(self._signer.sign(claims))


def _encrypt(device: Device, payload: bytes) -> bytes:
    from pywebpush import WebPusher

    return bytes(WebPusher(device.info()).encode(payload, "aes128gcm")["body"])


class WebPush(Channel):
    name = "webpush"

    def __init__(self, devices: Devices, keys: VapidKeys, http: Http) -> None:
        super().__init__("browsers subscribed from the dashboard", http)
        self.devices = devices
        self.keys = keys

    def _prepare(self, device: Device, message: Mapping[str, Any], urgent: bool) -> dict[str, Any]:
        """The encrypted body and the headers of one push (CPU work: run in a thread)."""
        body = _encrypt(device, json.dumps(message).encode())
        headers = {
            "Content-Type": "application/octet-stream",
            "Content-Encoding": "aes128gcm",
            "TTL": str(TTL),
            "Urgency": "high" if urgent else "normal",
            # A later message with the same topic replaces this one while the device is away:
            # a withdrawal overtakes the notification it withdraws.
            "Topic": str(message["tag"]),
            **self.keys.headers(device.endpoint),
        }
        return {"body": body, "headers": headers}

    async def push(self, device: Device, message: Mapping[str, Any], urgent: bool) -> Result:
        """One attempt at one device; a subscription the push service says is gone (404, 410)
        is forgotten."""
        try:
            ready = await asyncio.to_thread(self._prepare, device, message, urgent)
        except Exception as exc:  # keys the crypto refuses: this device fails, not the others
            return Result(False, f"cannot make the push: {exc}")
        result = await self.http.send("POST", device.endpoint, ready["body"], ready["headers"])
        if result.status in (404, 410):
            self.devices.remove(device.endpoint)
            return Result(False, f"{result.detail}; the subscription is gone and was removed")
        return result

    @staticmethod
    def message(notice: Notice) -> dict[str, Any]:
        """What the dashboard's service worker gets (it shows it, by `tag`)."""
        return {
            "type": "show",
            "tag": notice.id,
            "title": notice.title,
            "body": notice.body,
            "url": notice.url,
            "actions": notice.actions(),
        }

    async def attempt(self, notice: Notice) -> Result:
        """One try at every device (`sidecar notify test`)."""
        devices = self.devices.all()
        if not devices:
            return Result(False, 'no device is subscribed (the dashboard\'s "notify me")')
        message = self.message(notice)
        pushes = (self.push(d, message, notice.urgent) for d in devices)
        return summary(list(await asyncio.gather(*pushes)))

    async def deliver(self, notice: Notice) -> Result | None:
        """Each device with its own retries (a retry goes only where the push failed)."""
        message = self.message(notice)

        async def one(device: Device) -> Result | None:
            return await with_retries(
                lambda: self.push(device, message, notice.urgent), lambda: not notice.withdrawn
            )

        devices = self.devices.all()
        results = [r for r in await asyncio.gather(*(one(d) for d in devices)) if r is not None]
        return summary(results) if results else None

    async def withdraw(self, notice: Notice) -> None:
        message = {"type": "close", "tag": notice.id}
        for device in self.devices.all():
            result = await self.push(device, message, urgent=False)
            if not result.ok:
                log.info("Web Push: close of %s not delivered: %s", notice.id, result.detail)


def summary(results: list[Result]) -> Result:
    """One result for a push to several devices: ok if any got it."""
    good = sum(r.ok for r in results)
    detail = f"{good} of {len(results)} devices"
    bad = next((r for r in results if not r.ok), None)
    if bad is not None:
        detail += f"; {bad.detail}"
    return Result(good > 0, detail)
