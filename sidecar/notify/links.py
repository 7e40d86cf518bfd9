"""One-tap answers: capability links, each bound to one approval, one decision and the
supervisor that listed the approval, checked without a table of tokens.

A token is base64url(generation | decision | expiry | approval id | MAC), the MAC an HMAC-SHA256
under a key that init makes in memory before it starts the first supervisor: every supervisor it
starts again after a crash inherits the key through the fork, and nothing on disk or in an
environment ever holds it. So a token from a supervisor that crashed still verifies, and its
older generation says it is over (410), while one whose MAC does not verify is not ours (404),
whatever it claims. The approval's own bookkeeping makes a link work once (`Approvals.answer`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import struct
import time
from dataclasses import dataclass
from typing import Literal

Decision = Literal["allow", "deny"]
LINK_TTL = 24 * 3600  # seconds a link works at most, answered or not
MAC_BYTES = 16  # 128 bits: guessing one is out of reach
MAX_ID_BYTES = 64
MAX_TOKEN_CHARS = 200
_HEAD = struct.Struct(">IcI")  # generation, decision (b"a" / b"d"), expiry in unix seconds
_DECISION: dict[bytes, Decision] = {b"a": "allow", b"d": "deny"}
_DOMAIN = b"sleeve-link-v1\0"  # the key signs nothing else, but say what this MAC is


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True)
class Link:
    """What a token that verified says."""

    approval_id: str
    decision: Decision
    generation: int  # the supervisor that made it: init's count of restarts then
    expires: int  # unix seconds


class Links:
    """Makes and checks the tokens of one supervisor (`generation`: init's restart count)."""

    def __init__(self, key: bytes, generation: int, ttl: float = LINK_TTL) -> None:
        self._key = key
        self.generation = generation
        self.ttl = ttl

    def _mac(self, signed: bytes) -> bytes:
        return hmac.new(self._key, _DOMAIN + signed, hashlib.sha256).digest()[:MAC_BYTES]

    def mint(self, approval_id: str, decision: Decision) -> str:
        raw_id = approval_id.encode()
        if not 0 < len(raw_id) <= MAX_ID_BYTES:
            msg = f"approval id of {len(raw_id)} bytes cannot go into a link"
            raise ValueError(msg)
        expires = int(time.time() + self.ttl)
        signed = _HEAD.pack(self.generation, decision[0].encode(), expires) + raw_id
        return _encode(signed + self._mac(signed))

    def check(self, token: str) -> Link | None:
        """The link `token` names, if this sidecar made it (None: unknown, a 404)."""
        if not 0 < len(token) <= MAX_TOKEN_CHARS or not token.isascii():
            return None
        try:
            raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            return None
        if _encode(raw) != token:  # one spelling per token: no stray bits, no padding
            return None
        signed, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if len(signed) <= _HEAD.size or not hmac.compare_digest(mac, self._mac(signed)):
            return None
        generation, letter, expires = _HEAD.unpack_from(signed)
        decision = _DECISION.get(letter)
        try:
            approval_id = signed[_HEAD.size :].decode()
        except UnicodeDecodeError:
            return None
        if decision is None:
            return None
        return Link(approval_id, decision, generation, expires)

    def current(self, link: Link) -> bool:
        """Whether a link that verified still works: made by this supervisor, not expired."""
        return link.generation == self.generation and time.time() < link.expires
