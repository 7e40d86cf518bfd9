"""Secret values taken out of a byte stream before it is written: the sidecar's tokens and the
secrets the CLI must never show in a recording. A chunk that ends with the start of a secret
holds that start back until the next chunk tells whether the secret follows; only a true prefix
of a secret is ever held, so ordinary output is never delayed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MIN_SECRET = 8  # shorter values would take ordinary words out of the text
MASK = "[redacted]"
# Variables whose values are credentials by their name (API keys, tokens, passwords).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH", re.IGNORECASE)


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """The values of the variables in `env` that name a credential."""
    return [value for name, value in env.items() if SECRET_NAME.search(name)]


class Redactor:
    def __init__(self, secrets: Iterable[str]) -> None:
        values = {s.encode("utf-8", "surrogateescape") for s in secrets if len(s) >= MIN_SECRET}
        # Longest first: a secret that contains another is masked whole.
        self._values = sorted(values, key=len, reverse=True)
        self._bytes = (
            re.compile(b"|".join(re.escape(v) for v in self._values)) if self._values else None
        )
        self._held = b""

    @property
    def active(self) -> bool:
        return self._bytes is not None

    def feed(self, data: bytes) -> bytes:
        """`data` without the secrets in it, less a held-back tail that may begin one."""
        if self._bytes is None:
            return data
        data = self._bytes.sub(MASK.encode(), self._held + data)
        keep = self._partial(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep] if keep else data

    def flush(self) -> bytes:
        """What is held back (the stream ended: it was no secret)."""
        held, self._held = self._held, b""
        return held

    def text(self, value: str) -> str:
        """A whole string (a marker, a screen) without the secrets in it."""
        if self._bytes is None:
            return value
        raw = value.encode("utf-8", "surrogateescape")
        return self._bytes.sub(MASK.encode(), raw).decode("utf-8", "replace")

    def _partial(self, data: bytes) -> int:
        """The length of the longest tail of `data` that is a true prefix of a secret."""
        longest = 0
        size = len(data)
        for value in self._values:
            # Where a tail shorter than the secret could begin; later starts are shorter tails.
            pos = data.find(value[:1], max(0, size - len(value) + 1))
            while pos != -1 and size - pos > longest:
                if value.startswith(data[pos:]):
                    longest = size - pos
                    break
                pos = data.find(value[:1], pos + 1)
        return longest
