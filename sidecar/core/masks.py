"""The secrets' real values taken out of what leaves the sidecar: each occurrence becomes
`[secret:<name>]`. Installed once at start (`install`); the log formatter, the event stream, the
audit trail, the API's answers and notifications pass their text through `scrub`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping


class Masks:
    """`named`: real value -> its secret's name. A value is found as it is and as JSON writes
    it inside a string (a `"` or `\\` escaped), since most of what leaves is JSON."""

    def __init__(self, named: Mapping[str, str]) -> None:
        forms: dict[bytes, bytes] = {}
        for value, name in named.items():
            mask = f"[secret:{name}]".encode()
            forms[value.encode()] = mask
            forms[json.dumps(value)[1:-1].encode()] = mask
        self._masks = forms
        # Longest first: a value that holds another is masked whole.
        ordered = sorted(forms, key=len, reverse=True)
        self._pattern = re.compile(b"|".join(map(re.escape, ordered))) if ordered else None

    def scrub(self, data: bytes) -> bytes:
        if self._pattern is None:
            return data
        return self._pattern.sub(lambda m: self._masks[m.group(0)], data)

    def scrub_text(self, text: str) -> str:
        if self._pattern is None:
            return text
        raw = text.encode("utf-8", "surrogateescape")
        return self.scrub(raw).decode("utf-8", "surrogateescape")


_masks = Masks({})


def install(named: Mapping[str, str]) -> None:
    """The values to take out from now on (value -> secret name), for this process."""
    global _masks  # noqa: PLW0603 - one set per process, read where text leaves
    _masks = Masks(named)


def scrub(data: bytes) -> bytes:
    """`data` with every real value replaced by its mask."""
    return _masks.scrub(data)


def scrub_text(text: str) -> str:
    return _masks.scrub_text(text)
