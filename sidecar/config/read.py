"""The configuration's readers: one per kind of value (text, port, seconds, a number, a choice, a
URL), each naming the variable in the ConfigError it raises. The launcher reads the stop grace
with the same reader, to fit a pod's grace period to it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import Enum
from typing import TypeVar
from urllib.parse import urlsplit

from sidecar.core.contract import STOP_GRACE

MAX_SECONDS = 3600.0
MAX_URL = 2048

E = TypeVar("E", bound=Enum)


class ConfigError(Exception):
    """A configuration value is missing or malformed; the message names the variable."""


def text(env: Mapping[str, str], name: str) -> str | None:
    """`name`'s value; None when unset or blank."""
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    if "\x00" in value:
        msg = f"{name} must not contain NUL bytes"
        raise ConfigError(msg)
    return value


def required(env: Mapping[str, str], name: str) -> str:
    value = text(env, name)
    if value is None:
        msg = f"{name} is required and must not be empty"
        raise ConfigError(msg)
    return value


def port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = text(env, name)
    if raw is None:
        return default
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        msg = f"{name} must be an integer port number, got {raw!r}"
        raise ConfigError(msg) from None
    if not 1 <= value <= 65535:
        msg = f"{name} must be between 1 and 65535, got {value}"
        raise ConfigError(msg)
    return value


def seconds(
    env: Mapping[str, str], name: str, default: float, low: float, high: float = MAX_SECONDS
) -> float:
    value = number(env, name, "seconds", low=low, high=high)
    return default if value is None else value


def number(
    env: Mapping[str, str], name: str, what: str, *, low: float, high: float, integer: bool = False
) -> float | None:
    """A number (`integer`: a whole one) from `low` to `high`; None when unset."""
    raw = text(env, name)
    if raw is None:
        return None
    try:
        value = float(int(raw.strip(), 10)) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        msg = f"{name} must be {kind} of {what}, got {raw!r}"
        raise ConfigError(msg) from None
    if not math.isfinite(value) or not low <= value <= high:
        msg = f"{name} must be between {low:g} and {high:g} {what}, got {raw!r}"
        raise ConfigError(msg)
    return value


def choice(env: Mapping[str, str], name: str, default: E) -> E:
    """One of the values of `default`'s enum, in any case."""
    raw = (text(env, name) or default.value).strip().lower()
    try:
        return type(default)(raw)
    except ValueError:
        values = [str(member.value) for member in type(default)]
        allowed = " or ".join(values) if len(values) == 2 else f"one of {', '.join(values)}"
        msg = f"{name} must be {allowed}; got {raw!r}"
        raise ConfigError(msg) from None


def url(env: Mapping[str, str], name: str, *, plain: bool = False) -> str | None:
    """An http(s) URL with a host (`plain`: and no user, query or fragment); None when unset."""
    raw = text(env, name)
    if raw is None:
        return None
    value = raw.strip()
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        parts = None
    bad = (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or len(value) > MAX_URL
        or any(c.isspace() or not c.isprintable() for c in value)
        or (plain and (parts.query or parts.fragment or "@" in parts.netloc))
    )
    if bad:
        msg = f"{name} must be an http:// or https:// URL with a host, got {raw!r}"
        raise ConfigError(msg)
    return value


def stop_grace(env: Mapping[str, str]) -> float:
    """SIDECAR_STOP_GRACE (the launcher reads it too, to fit a pod's grace period to it)."""
    return seconds(env, "SIDECAR_STOP_GRACE", STOP_GRACE, 0)
