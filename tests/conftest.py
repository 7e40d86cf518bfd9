"""Shared fixtures: real sidecar processes on free loopback ports, torn down even on failure."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Sidecar


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temp dir: a tmux socket path must stay under the 108-byte UNIX socket limit."""
    path = Path(tempfile.mkdtemp(prefix="sc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_sidecar(short_tmp: Path) -> Iterator[Callable[..., Sidecar]]:
    made: list[Sidecar] = []

    def make(**kw: Any) -> Sidecar:
        sub = short_tmp / f"s{len(made)}"
        sub.mkdir()
        sc = Sidecar(sub, **kw)
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.kill_everything()
