"""Where the tests find the pinned AI CLIs installed from npm (Codex, Gemini CLI, opencode): the
project's cache first, then a machine-wide copy; a test whose CLI is in neither is skipped."""

from __future__ import annotations

from pathlib import Path

from tests.tools import missing

REPO = Path(__file__).resolve().parent.parent
PLACES = (REPO / ".cache" / "clis", Path("/tmp/clis"))


def cli_path(name: str) -> Path:
    """The npm launcher of the CLI named `name` (node_modules/.bin/<name>)."""
    for place in PLACES:
        found = place / "node_modules" / ".bin" / name
        if found.exists():
            return found
    missing(f"{name} is not installed in {' or '.join(str(p) for p in PLACES)}")
