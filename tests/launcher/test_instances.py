"""Instances: canonical roots (real git worktrees), per-project history dirs, and gc."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.launcher.instances import canonical_root, ensure_instance, instance_dir, sha16
from tests.tools import require_executable

from .helpers import REPO, SLEEVE, Result


def git(*args: str | Path, cwd: Path) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *map(str, args)],
        cwd=cwd, check=True, capture_output=True,
    )  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git("init", "-q", cwd=path)
    git("commit", "-q", "--allow-empty", "-m", "first", cwd=path)
    return path


def test_every_worktree_of_a_repo_shares_one_instance(
    repo: Path, tmp_path: Path, home: Path, sleeve: Callable[..., Result]
) -> None:
    worktree = tmp_path / "elsewhere" / "wt"
    git("worktree", "add", "-q", worktree, cwd=repo)
    (repo / "sub" / "dir").mkdir(parents=True)
    roots = {canonical_root(p) for p in (repo, worktree, repo / "sub" / "dir")}
    assert roots == {repo.resolve()}
    assert sleeve("create", "--project", worktree).code == 0
    assert sleeve("create", "--project", repo).code == 0
    listing = json.loads(sleeve("instances", "--json").out)
    assert [i["root"] for i in listing] == [str(repo.resolve())]
    assert listing[0]["sha16"] == hashlib.sha256(str(repo.resolve()).encode()).hexdigest()[:16]
    # both creates landed in the same project: slots 1 and 2 of one counter
    slots = json.loads(sleeve("slots", "--project", worktree, "--json").out)["slots"]
    assert [s["index"] for s in slots] == [1, 2]


def test_canonical_root_outside_git_is_the_resolved_path(tmp_path: Path) -> None:
    real = tmp_path / "real dir"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert canonical_root(link) == real.resolve()


def test_canonical_root_ignores_git_dir_in_the_environment(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "plain"
    other.mkdir()
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert canonical_root(other) == other.resolve()


def test_project_root_is_written_once_on_creation(home: Path, tmp_path: Path) -> None:
    root = tmp_path / "proj"
    path = ensure_instance(home, root)
    assert path == home / "instances" / sha16(root)
    (path / "project-root").write_text("/edited/by/hand")
    ensure_instance(home, root)
    assert (path / "project-root").read_text() == "/edited/by/hand"
    assert (path / "history.jsonl").is_file() and (path / "projects").is_dir()
    assert oct(path.stat().st_mode & 0o777) == "0o700"
    assert oct((path / "project-root").stat().st_mode & 0o777) == "0o600"


def test_gc_removes_instances_of_deleted_roots_and_prints_them_on_stderr(
    home: Path, tmp_path: Path, sleeve: Callable[..., Result]
) -> None:
    kept, gone = tmp_path / "kept", tmp_path / "gone proj"
    kept.mkdir()
    gone.mkdir()
    for path in (kept, gone):
        assert sleeve("create", "--project", path).code == 0
    shutil.rmtree(gone)

    dry = sleeve("gc", "--dry-run")
    assert dry.code == 0 and f"would remove {gone}" in dry.err
    assert instance_dir(home, gone).exists()

    res = sleeve("gc")
    assert res.code == 0 and f"removed {gone}" in res.err and str(kept) not in res.err
    assert not instance_dir(home, gone).exists()
    assert instance_dir(home, kept).exists()
    listing = json.loads(sleeve("instances", "--json").out)
    assert [(i["root"], i["exists"]) for i in listing] == [(str(kept), True)]


def test_gc_refuses_symlinked_instances_and_skips_unreadable_ones(
    home: Path, tmp_path: Path, sleeve: Callable[..., Result], caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "project-root").write_text(str(tmp_path / "no such root"))
    (outside / "data").write_text("keep me")
    base = home / "instances"
    base.mkdir(parents=True)
    (base / "aaaaaaaaaaaaaaaa").symlink_to(outside)
    (base / "bbbbbbbbbbbbbbbb").mkdir()  # no project-root at all
    (base / "cccccccccccccccc").mkdir()
    (base / "cccccccccccccccc" / "project-root").mkdir()  # unreadable as a file

    res = sleeve("gc")
    assert res.code == 0
    assert (outside / "data").read_text() == "keep me"
    assert (base / "aaaaaaaaaaaaaaaa").is_symlink()
    assert (base / "bbbbbbbbbbbbbbbb").is_dir() and (base / "cccccccccccccccc").is_dir()
    assert "refusing symlinked" in caplog.text
    assert caplog.text.count("no readable project-root") == 2


def test_instances_lists_size_and_missing_roots(
    home: Path, tmp_path: Path, sleeve: Callable[..., Result]
) -> None:
    root = tmp_path / "p"
    path = ensure_instance(home, root)
    (path / "history.jsonl").write_text("x" * 2000)
    out = sleeve("instances").out
    assert str(root) in out and " no " in out and "2.0K" in out
    for name in ("history.jsonl", "project-root"):
        os.utime(path / name, (1000, 1000))
    (listed,) = json.loads(sleeve("instances", "--json").out)
    assert listed["size"] == 2000 + len(str(root))
    assert listed["last_used"] == 1000
    assert listed["exists"] is False


def test_gc_reads_project_root_without_echos_trailing_newline(
    home: Path, tmp_path: Path, sleeve: Callable[..., Result]
) -> None:
    """claudebox-bwrap writes project-root with `echo`: `\\n` (or `\\r\\n`) is not the path's,
    but trailing spaces are."""
    live, spaced, gone = tmp_path / "live", tmp_path / "ends in spaces  ", tmp_path / "gone"
    live.mkdir()
    spaced.mkdir()
    written = {"a" * 16: f"{live}\n", "b" * 16: f"{spaced}\r\n", "c" * 16: f"{gone}\n"}
    for sha, text in written.items():
        (home / "instances" / sha).mkdir(parents=True)
        (home / "instances" / sha / "project-root").write_bytes(text.encode())

    res = sleeve("gc")
    assert res.code == 0
    assert res.err == f"removed {gone}\n"
    assert sorted(p.name for p in (home / "instances").iterdir()) == ["a" * 16, "b" * 16]
    listing = json.loads(sleeve("instances", "--json").out)
    assert [(i["root"], i["exists"]) for i in listing] == [(str(live), True), (str(spaced), True)]


def test_gc_skips_an_instance_whose_root_it_cannot_stat(
    home: Path, tmp_path: Path, env: dict[str, str]
) -> None:
    """A real EACCES: the root sits in a 000 dir. As root, `sleeve gc` runs without the
    DAC-override capabilities (setpriv), so the permission bits bind it like anyone else."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        require_executable("setpriv", "util-linux: as root, to drop CAP_DAC_OVERRIDE")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    sealed = tmp_path / "sealed"
    (sealed / "proj").mkdir(parents=True)
    hidden, gone = ensure_instance(home, sealed / "proj"), ensure_instance(home, tmp_path / "gone")
    sealed.chmod(0)
    try:
        out = subprocess.run(
            [*prefix, *SLEEVE, "gc"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60
        )
    finally:
        sealed.chmod(0o700)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert f"gc: skipping {hidden}: cannot tell whether {sealed / 'proj'} exists" in out.stderr
    assert f"removed {tmp_path / 'gone'}" in out.stderr  # the rest of gc still happens
    assert hidden.is_dir() and not gone.exists()
