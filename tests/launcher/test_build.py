"""`sleeve build`: the inputs checksum and the skip decision (the real build runs in e2e)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.launcher.engine import (
    INPUTS_LABEL,
    build_argv,
    copy_sources,
    inputs_checksum,
    needs_build,
)
from tests.tools import require_executable

from .helpers import REPO, Result

DOCKERFILE = """\
FROM debian:bookworm-slim AS base
COPY --from=base /etc/hostname /x
COPY --chown=0:0 app/ /app/
ADD one.txt \\
    two.txt /opt/
RUN echo hi
"""


@pytest.fixture
def context(tmp_path: Path) -> Path:
    ctx = tmp_path / "ctx"
    (ctx / "app" / "__pycache__").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print(1)\n")
    (ctx / "app" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\x00")
    (ctx / "one.txt").write_text("1")
    (ctx / "two.txt").write_text("2")
    (ctx / "unrelated.md").write_text("not copied")
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    return ctx


def test_copy_sources_are_the_context_paths_of_copy_and_add() -> None:
    assert copy_sources(DOCKERFILE) == ["app/", "one.txt", "two.txt"]


def test_the_projects_dockerfile_inputs_include_the_package() -> None:
    dockerfile = REPO / "image" / "Dockerfile"
    if not dockerfile.exists():
        pytest.skip("image/Dockerfile not in this checkout")
    sources = copy_sources(dockerfile.read_text())
    assert "sidecar/" in sources and "pyproject.toml" in sources


def test_checksum_follows_copied_files_only(context: Path) -> None:
    dockerfile = context / "Dockerfile"
    first = inputs_checksum(context, dockerfile, {})
    (context / "unrelated.md").write_text("changed")
    (context / "app" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\x01")
    assert inputs_checksum(context, dockerfile, {}) == first
    (context / "app" / "main.py").write_text("print(2)\n")
    second = inputs_checksum(context, dockerfile, {})
    assert second != first
    (context / "two.txt").write_text("22")
    assert inputs_checksum(context, dockerfile, {}) != second


def test_checksum_follows_the_dockerfile_and_build_args(context: Path) -> None:
    dockerfile = context / "Dockerfile"
    base = inputs_checksum(context, dockerfile, {})
    assert inputs_checksum(context, dockerfile, {"CA": "x"}) != base
    dockerfile.write_text(DOCKERFILE + "RUN true\n")
    assert inputs_checksum(context, dockerfile, {}) != base


@pytest.mark.parametrize(
    ("existing", "force", "build"),
    [("abc", False, False), ("abc", True, True), ("old", False, True), (None, False, True)],
)
def test_an_unchanged_checksum_skips_the_build_unless_forced(
    existing: str | None, force: bool, build: bool
) -> None:
    assert needs_build("abc", existing, force=force) is build


def test_build_argv_labels_the_image_with_its_inputs(context: Path) -> None:
    argv = build_argv("sleeve:latest", context, context / "Dockerfile", "abc", {"K": "v"})
    assert argv[:2] == ["docker", "build"] and argv[-1] == str(context)
    assert f"{INPUTS_LABEL}=abc" in argv and "K=v" in argv


def test_build_without_a_dockerfile_is_a_clear_error(
    tmp_path: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("build", "--context", tmp_path)
    assert res.code == 1 and "no Dockerfile" in res.err


def test_build_without_an_engine_names_the_runtime(
    tmp_path: Path, context: Path, sleeve_proc: Callable[..., Result]
) -> None:
    require_executable("docker", "the client, not an engine; scripts/setup --test installs it")
    dead = f"unix://{tmp_path}/no-engine.sock"
    res = sleeve_proc(
        "build",
        "--context",
        context,
        "--file",
        context / "Dockerfile",
        extra_env={"DOCKER_HOST": dead},
    )
    assert res.code == 1 and "runtime docker" in res.err
