"""The secrets' placeholders: random per sleeve, kept in a 0600 file of the state dir so that a
resleeve or a supervisor started again gives the CLI the same ones (a CLI that remembers an
approved key keeps working).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from pathlib import Path

from sidecar.core.files import read_regular, write_new
from sidecar.egress.substitute import PREFIX

RANDOM_BYTES = 16


def make(name: str) -> str:
    """A new placeholder for secret `name`: says what it is to a person reading a log."""
    return f"{PREFIX}{name}-{secrets.token_hex(RANDOM_BYTES)}"


def _fits(name: str, value: object) -> bool:
    return (
        isinstance(value, str)
        and value.startswith(f"{PREFIX}{name}-")
        and len(value) == len(make(name))
    )


def load(path: Path, names: Iterable[str]) -> dict[str, str]:
    """Secret name -> its placeholder: the ones kept at `path`, a new one for a secret without
    (the file then written again). A file that is unreadable or not ours is replaced."""
    raw = read_regular(path)
    try:
        kept = json.loads(raw) if raw else {}
    except ValueError:
        kept = {}
    kept = kept if isinstance(kept, dict) else {}
    found = {n: kept[n] if _fits(n, kept.get(n)) else make(n) for n in names}
    if found != kept:
        write_new(path, json.dumps(found).encode(), 0o600)
    return found
