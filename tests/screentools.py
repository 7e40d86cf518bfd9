"""Screens for the recognizer tests: the captured ones under tests/screens/<cli>/ (each a
`tmux capture-pane -p` of the pinned CLI, headed `# rows cols cursor_row cursor_col seen
[reason]`), and hand-made ones."""

from __future__ import annotations

from pathlib import Path

from sidecar.agent.screens import Reading, Seen
from sidecar.pane.screen import Screen

SCREENS = Path(__file__).parent / "screens"
ROWS, COLS = 50, 200  # the pane's size


def load_screen(path: Path) -> tuple[Screen, Reading]:
    """A captured screen, and the reading its header says it gets."""
    head, *lines = path.read_text(encoding="utf-8").split("\n")
    words = head.removeprefix("# ").split(" ", 5)
    rows, cols, row, col = (int(w) for w in words[:4])
    lines = (lines + [""] * rows)[:rows]
    expected = Reading(Seen(words[4]), words[5] if len(words) > 5 else None)
    return Screen(rows, cols, tuple(lines), row, col), expected


def screen_of(*lines: str, cursor: tuple[int, int] | None = None) -> Screen:
    """A pane showing `lines` from the top, the cursor at `cursor` (row, column): by default
    at the end of the last line."""
    padded = (list(lines) + [""] * ROWS)[:ROWS]
    row, col = cursor if cursor else (max(len(lines) - 1, 0), len(lines[-1]) if lines else 0)
    return Screen(ROWS, COLS, tuple(padded), row, col)
