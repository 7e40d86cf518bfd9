"""Text from the CLI, its hooks or its screen made fit for a status field or a log line: one
line of printable characters, bounded."""

from __future__ import annotations

MAX_REASON = 300  # characters of a reason kept (a command line can be long)


def one_line(text: str, limit: int = MAX_REASON) -> str:
    """`text` as one line of printable characters, at most `limit` long."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
