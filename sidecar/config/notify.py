"""The notification settings (SIDECAR_PUBLIC_URL, SIDECAR_NOTIFY_*), read once: where
notifications go, what notifies, and when (`sidecar.notify` acts on them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from sidecar.config.read import ConfigError, choice, seconds, text, url
from sidecar.security import tokens

#: What may notify (SIDECAR_NOTIFY_ON), and the defaults of the notification settings.
NOTIFY_KINDS = ("waiting", "idle", "exited", "budget", "egress")
NOTIFY_ON = frozenset({"waiting", "exited"})
NOTIFY_DWELL = 5.0
NOTIFY_COOLDOWN = 60.0


class WebPush(Enum):
    OFF = "off"
    ON = "on"


def _secret_file(env: Mapping[str, str], name: str) -> str | None:
    path = text(env, name)
    if path is None:
        return None
    try:
        return tokens.read_token_file(name, path)
    except tokens.TokenError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class NotifyConfig:
    """SIDECAR_PUBLIC_URL and SIDECAR_NOTIFY_*: the channels, what notifies, and when."""

    public_url: str | None = None  # without a trailing slash; links are built on it
    webhook: str | None = None
    webhook_secret: str = field(default="", repr=False)
    ntfy: str | None = None  # the topic's URL
    ntfy_token: str | None = field(default=None, repr=False)  # SIDECAR_NOTIFY_NTFY_TOKEN_FILE
    webpush: bool = False
    on: frozenset[str] = NOTIFY_ON
    dwell: float = NOTIFY_DWELL
    cooldown: float = NOTIFY_COOLDOWN
    # The secret files read above, (variable, absolute path): the sidecar's to trust.
    files: tuple[tuple[str, Path], ...] = ()

    @property
    def any_channel(self) -> bool:
        return bool(self.webhook or self.ntfy or self.webpush)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NotifyConfig:
        public = url(env, "SIDECAR_PUBLIC_URL", plain=True)
        webhook = url(env, "SIDECAR_NOTIFY_WEBHOOK")
        secret = _secret_file(env, "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE")
        if webhook is not None and secret is None:
            msg = (
                "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE is required with SIDECAR_NOTIFY_WEBHOOK: "
                "name a file holding the secret its bodies are signed with"
            )
            raise ConfigError(msg)
        ntfy = url(env, "SIDECAR_NOTIFY_NTFY", plain=True)
        if ntfy is not None and not re.fullmatch(r"[-_A-Za-z0-9]{1,64}", ntfy.rsplit("/", 1)[-1]):
            msg = (
                "SIDECAR_NOTIFY_NTFY must be the URL of an ntfy topic, like "
                f"https://ntfy.sh/my-topic (letters, digits, - and _), got {ntfy!r}"
            )
            raise ConfigError(msg)
        webpush = choice(env, "SIDECAR_NOTIFY_WEBPUSH", WebPush.OFF) is WebPush.ON
        if webpush and public is None:
            msg = "SIDECAR_NOTIFY_WEBPUSH=on needs SIDECAR_PUBLIC_URL (the page people open)"
            raise ConfigError(msg)
        raw_on = text(env, "SIDECAR_NOTIFY_ON")
        on = frozenset(raw_on.lower().replace(",", " ").split()) if raw_on else NOTIFY_ON
        if not on or not on <= set(NOTIFY_KINDS):
            msg = f"SIDECAR_NOTIFY_ON must list some of {', '.join(NOTIFY_KINDS)}; got {sorted(on)}"
            raise ConfigError(msg)
        return cls(
            public_url=public.rstrip("/") if public else None,
            webhook=webhook,
            webhook_secret=secret or "",
            ntfy=ntfy,
            ntfy_token=_secret_file(env, "SIDECAR_NOTIFY_NTFY_TOKEN_FILE"),
            webpush=webpush,
            on=on,
            dwell=seconds(env, "SIDECAR_NOTIFY_DWELL", NOTIFY_DWELL, 0),
            cooldown=seconds(env, "SIDECAR_NOTIFY_COOLDOWN", NOTIFY_COOLDOWN, 0, 86400),
            files=tuple(
                (name, Path(raw).absolute())
                for name in ("SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE", "SIDECAR_NOTIFY_NTFY_TOKEN_FILE")
                if (raw := text(env, name)) is not None
            ),
        )
