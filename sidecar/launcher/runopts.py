"""What `sleeve run` checks before it plans a sleeve: the resource limits (`--cpus`,
`--memory`, `--pids-limit`) and the sleeve's API tokens (the caller's own, else a new one:
a sleeve is never open by default)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.plan import Limits
from sidecar.security import tokens

MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
DOCKER_MIN_MEMORY = 6 << 20


def memory(text: str) -> int:
    """Docker's --memory syntax: a number of bytes with an optional b, k, m or g."""
    raw = text.strip().lower()
    unit = raw[-1] if raw[-1:].isalpha() else ""
    number = raw[: len(raw) - len(unit)]
    if unit not in MEMORY_UNITS or not number.isdigit() or int(number) == 0:
        msg = f"--memory {text!r}: give a size such as 512m or 2g"
        raise LauncherError(msg)
    value = int(number) * MEMORY_UNITS[unit]
    if value < DOCKER_MIN_MEMORY:
        msg = f"--memory {text!r} is below Docker's minimum of 6m"
        raise LauncherError(msg)
    return value


def limits(cpus: float | None, memory_text: str | None, pids: int | None) -> Limits:
    if cpus is not None and not 0 < cpus < 4096:  # also false for nan
        msg = f"--cpus {cpus:g} must be a positive number of CPUs"
        raise LauncherError(msg)
    if pids is not None and pids < 1:
        msg = f"--pids-limit {pids} must be at least 1"
        raise LauncherError(msg)
    return Limits(cpus, memory(memory_text) if memory_text is not None else None, pids)


def sleeve_tokens(env: Mapping[str, str]) -> dict[str, str]:
    """The caller's own tokens (SIDECAR_TOKEN or SIDECAR_TOKEN_FILE, and the view token
    likewise), else a new admin token."""
    found = {}
    for var in tokens.TOKEN_VARS:
        try:
            value = tokens.resolve(env, var)
        except tokens.TokenError as exc:
            raise LauncherError(str(exc)) from None
        if value is not None:
            found[var] = value
    found.setdefault(tokens.TOKEN_VAR, secrets.token_urlsafe(32))
    return found
