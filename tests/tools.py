"""The one rule for a test whose tool is missing: outside CI a skip with the reason, in CI a
failure (`scripts/setup --test` installs every tool, so a missing one in CI is a broken set-up,
and CI must never go green by not running a test).

Three ways in, one rule: `require_executable(name)` inside a test or fixture,
`@pytest.mark.needs("bwrap", ...)` on a test or a module (tests/conftest.py applies it before
the test runs), and `missing(reason)` for anything else that is not there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest

SETUP = "scripts/setup --test installs it"
REPO = Path(__file__).resolve().parent.parent
# Codex, Gemini CLI and opencode as image/clis/ pins them (scripts/setup --test links them here)
CLI_BIN = REPO / ".cache" / "clis" / "bin"
# tmux 3.5a as scripts/build-tmux builds it (docs/tmux.md): first on the tests' PATH
TMUX_BIN = REPO / ".cache" / "tmux" / "bin"
# The system's Python, for what runs as an unprivileged uid: the venv's interpreter may live
# under root's 0700 home.
SYSTEM_PYTHON = "/usr/bin/python3"


def in_ci() -> bool:
    """`CI` set to anything but empty, `0` or `false` (any case)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def missing(reason: str) -> NoReturn:
    """Skip (outside CI) or fail (in CI) the running test because `reason` is not available."""
    if in_ci():
        pytest.fail(f"in CI every tool must be installed: {reason}")
    pytest.skip(reason)


def require_executable(name: str, why: str = SETUP) -> str:
    """The path of executable `name` on PATH, or skip/fail the test as `missing` does."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed{f' ({why})' if why else ''}")
    return path


def require_chromium() -> str:
    """Headless Chromium: Debian's `chromium`, or `chromium-browser` as other distributions
    name it."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        missing(f"chromium is not installed ({SETUP}: apt-get install chromium)")
    return path


def cli_bin(name: str) -> Path:
    """The pinned AI CLI command `name` (`codex`, `gemini`, `opencode`) in `CLI_BIN`, or skip/fail
    the test as `missing` does. Put its folder first on the CLI's PATH: `gemini` runs on the
    `node` beside it."""
    path = CLI_BIN / name
    if not path.exists():  # follows the link: a dangling one is missing too
        missing(f"{name} is not installed at {path} ({SETUP} from image/clis/)")
    return path
