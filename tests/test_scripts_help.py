"""Every script in scripts/ answers `--help` (and `-h`) with what it does, exit 0, and runs
nothing else: `scripts/demo --help` once started the demo."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO

SCRIPTS = sorted(p for p in (REPO / "scripts").iterdir() if p.is_file() and os.access(p, os.X_OK))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_script_answers_help_and_does_nothing_else(
    script: Path, flag: str, tmp_path: Path
) -> None:
    # A HOME of its own: anything the script would set up or start lands (visibly) there.
    env = {**os.environ, "HOME": str(tmp_path), "DEMO_DIR": str(tmp_path / "demo")}
    done = subprocess.run(
        [script, flag], capture_output=True, text=True, timeout=30, env=env, check=False
    )
    assert done.returncode == 0, done.stderr
    header = script.read_text().splitlines()[1].removeprefix("# ")
    assert done.stdout.startswith(header), done.stdout
    assert not list(tmp_path.iterdir())  # no demo dir, no cache: nothing ran
