"""The rewrite of a request head for the hosts secrets go to: each listed secret's placeholder
replaced by its real value in the request line and the header lines (inside `Authorization:
Basic` credentials too, decoded and encoded again), never in a body. A placeholder seen on its
way to a host it is not listed for goes unchanged and is counted.
"""

from __future__ import annotations

import binascii
import functools
import logging
from base64 import b64decode, b64encode
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.egress.allowlist import Pattern

if TYPE_CHECKING:
    from sidecar.egress.proxy import Rewrite

log = logging.getLogger(__name__)

PREFIX = "sleeve-placeholder-"
MAX_TOLD = 256  # (secret, host) pairs logged once each; then only counted
_BASIC = b"authorization: basic "


@dataclass(frozen=True)
class Swap:
    """One secret as the proxy sees it: its placeholder, its value, the hosts it goes to."""

    name: str
    placeholder: bytes
    value: bytes = field(repr=False)
    hosts: tuple[Pattern, ...]

    def listed(self, host: str) -> bool:
        """Whether the value goes to `host` (normalised), on any port."""
        return any(
            host.endswith("." + p.host) if p.wildcard else host == p.host for p in self.hosts
        )


class Substitution:
    """The proxy's `Secrets`: called with a normalised host, the Rewrite for the secrets listed
    for it, or None when none is (the request goes out as it is). `unlisted` counts, per
    secret, the requests that carried its placeholder to a host it is not listed for."""

    def __init__(self, swaps: Iterable[Swap]) -> None:
        self.swaps = tuple(swaps)
        self.unlisted: dict[str, int] = {s.name: 0 for s in self.swaps}
        self._told: set[tuple[str, str]] = set()

    def __call__(self, host: str) -> Rewrite | None:
        listed = tuple(s for s in self.swaps if s.listed(host))
        if not listed:
            return None
        others = tuple(s for s in self.swaps if s not in listed)
        return functools.partial(self._rewrite, host, listed, others)

    def scan(self, host: str, head: bytes) -> None:
        """Count the placeholders in a head that goes to `host` unchanged (no secret listed)."""
        self._count(host, self.swaps, head)

    def _rewrite(
        self, host: str, listed: tuple[Swap, ...], others: tuple[Swap, ...], head: bytes
    ) -> bytes:
        if others:
            self._count(host, others, head)
        if _BASIC in head.lower():
            head = _in_basic(head, listed)
        for swap in listed:
            head = head.replace(swap.placeholder, swap.value)
        return head

    def _count(self, host: str, swaps: tuple[Swap, ...], head: bytes) -> None:
        if PREFIX.encode() not in head and _BASIC not in head.lower():
            return  # the common case: one search, nothing decoded
        seen = head + b"\n" + b"\n".join(_basic_credentials(head))
        for swap in swaps:
            if swap.placeholder in seen:
                self.unlisted[swap.name] += 1
                if len(self._told) < MAX_TOLD and (swap.name, host) not in self._told:
                    self._told.add((swap.name, host))
                    log.warning(
                        "egress: secret %s's placeholder was sent to %s, which it is not "
                        "listed for; it went unchanged",
                        swap.name,
                        host,
                    )


def _basic_credentials(head: bytes) -> list[bytes]:
    """The decoded `user:password` of each `Authorization: Basic` header in `head`."""
    found = []
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(_BASIC):
            decoded = _decode(line[len(_BASIC) :].strip())
            if decoded is not None:
                found.append(decoded)
    return found


def _decode(token: bytes) -> bytes | None:
    try:
        return b64decode(token, validate=True)
    except (binascii.Error, ValueError):
        return None


def _in_basic(head: bytes, listed: tuple[Swap, ...]) -> bytes:
    """`head` with the listed placeholders replaced inside Basic credentials (git sends a
    token as the password of `Authorization: Basic base64(user:token)`)."""
    lines = head.split(b"\r\n")
    for i, line in enumerate(lines[1:], 1):
        if not line.lower().startswith(_BASIC):
            continue
        decoded = _decode(line[len(_BASIC) :].strip())
        if decoded is None:
            continue  # not base64: sent as it is
        swapped = decoded
        for swap in listed:
            swapped = swapped.replace(swap.placeholder, swap.value)
        if swapped != decoded:
            lines[i] = line[: len(_BASIC)] + b64encode(swapped)
    return b"\r\n".join(lines)
