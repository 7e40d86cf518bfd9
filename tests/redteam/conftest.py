"""The red team's tools: the attacker's LD_PRELOAD library, built with gcc, and a directory
every uid may use."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
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


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every uid may enter and write, as the agent's own places are (tmp_path is
    root's 0700: a connect from another uid would fail there for the wrong reason)."""
    path = Path(tempfile.mkdtemp(prefix="redteam-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
