"""The red team's tools: the attacker's LD_PRELOAD library, built with gcc."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture
def preload(tmp_path: Path) -> Callable[[Path], Path]:
    """Builds tests/redteam/preload.c into a library that appends "pid seccomp-mode" to `log`
    in each process that loads it; returns the library's path."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the attacker's library")

    def build(log: Path) -> Path:
        lib = tmp_path / "libmark.so"
        source = str(HERE / "preload.c")
        cmd = ["gcc", "-shared", "-fPIC", "-o", str(lib), f'-DMARK_LOG="{log}"', source]
        subprocess.run(cmd, check=True)
        return lib

    return build
