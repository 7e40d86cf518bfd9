"""Fixtures for the launcher tests: a private `$SLEEVE_HOME`, project dirs, and `sleeve` runners.

`sleeve` runs in-process (`main(argv, env)`) where speed matters and as a real subprocess
where processes are the point (parallel creates, detached runs).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.launcher.cli import main

from .helpers import REPO, SLEEVE, Result


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "sleeve-home"


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    """The environment every `sleeve` call in a test gets: only this test's SLEEVE_HOME."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLEEVE_", "DOCKER_"))}
    base["SLEEVE_HOME"] = str(home)
    base["PYTHONPATH"] = str(REPO)
    return base


@pytest.fixture
def project(tmp_path: Path) -> Path:
    path = tmp_path / "my project"
    path.mkdir()
    return path


@pytest.fixture
def sleeve(env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """Run `sleeve ARGS` in-process and return exit code, stdout and stderr."""

    def run(*args: str | Path, extra_env: dict[str, str] | None = None) -> Result:
        capsys.readouterr()
        code = main([str(a) for a in args], {**env, **(extra_env or {})})
        cap = capsys.readouterr()
        return Result(code, cap.out, cap.err)

    return run


@pytest.fixture
def sleeve_proc(env: dict[str, str]) -> Iterator[Callable[..., Result]]:
    """Run `sleeve ARGS` as a real process."""

    def run(
        *args: str | Path, extra_env: dict[str, str] | None = None, timeout: float = 60
    ) -> Result:
        out = subprocess.run(
            [*SLEEVE, *(str(a) for a in args)],
            env={**env, **(extra_env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            check=False,
        )
        return Result(out.returncode, out.stdout, out.stderr)

    yield run
