"""Where the tests find the real AI CLIs (pinned in the README): the project's cache first
(`.cache/clis`, filled by the test setup), then a machine-wide install in /tmp/clis; a test
whose CLI is in neither skips (fails in CI) naming both places."""

from __future__ import annotations

from pathlib import Path

from tests.tools import missing

REPO = Path(__file__).resolve().parent.parent
PLACES = (REPO / ".cache" / "clis", Path("/tmp/clis"))


def cli_path(name: str) -> Path:
    """The real CLI `name` (its npm bin name: `opencode`, `codex`, `gemini`)."""
    for place in PLACES:
        found = place / "node_modules" / ".bin" / name
        if found.exists():
            return found
    where = " or ".join(str(p / "node_modules" / ".bin" / name) for p in PLACES)
    missing(f"the {name} CLI is not installed at {where}")
