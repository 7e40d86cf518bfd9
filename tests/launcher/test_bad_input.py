"""Bad input: hostile project paths, missing things, unwritable homes, absent runtimes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.launcher.bwrap import spawn_detached
from sidecar.launcher.instances import instance_dir
from sidecar.launcher.slots import Project
from sidecar.launcher.state import Run, StateStore
from tests.tools import require_executable

from .helpers import Result, mount_fields

NAMES = {
    "spaces": "my  project dir",
    "quotes": 'it\'s "quoted"',
    "command": "$(touch PWNED)`touch PWNED2`",
    "newline": "line\nbreak",
    "unicode": "projét 漢字 🙂",
    "semicolon": "a;b&&c|d",
    "comma-colon": "a,b:c=d",
}


@pytest.mark.parametrize("name", list(NAMES.values()), ids=list(NAMES))
def test_hostile_project_paths_stay_single_argv_words(
    name: str, tmp_path: Path, home: Path, sleeve: Callable[..., Result]
) -> None:
    project = tmp_path / name
    project.mkdir()
    res = sleeve("create", "--project", project, "--json")
    assert res.code == 0, res.err
    assert (instance_dir(home, project) / "project-root").read_text() == str(project)
    assert len(json.loads(sleeve("slots", "--project", project, "--json").out)["slots"]) == 1
    for runtime in ("bwrap", "docker"):
        res = sleeve("run", "--project", project, "--runtime", runtime, "--dry-run")
        assert res.code == 0, res.err
        argv = shlex.split(res.out)
        if runtime == "bwrap":
            assert argv[argv.index("/workspace") - 1] == str(project)
        else:
            assert mount_fields(argv)[0]["source"] == str(project)
    assert not list(tmp_path.rglob("PWNED*"))


def test_trailing_slash_and_symlink_name_the_same_project(
    tmp_path: Path, home: Path, sleeve: Callable[..., Result]
) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    for path in (f"{real}/", str(link), f"{link}/"):
        assert sleeve("create", "--project", path).code == 0
    slots = json.loads(sleeve("slots", "--project", real, "--json").out)
    assert slots["project"] == str(real) and len(slots["slots"]) == 3
    assert [p.name for p in (home / "projects").iterdir()] == [Project(real, home).key]


def test_missing_project_path_is_refused(tmp_path: Path, sleeve: Callable[..., Result]) -> None:
    res = sleeve("create", "--project", tmp_path / "nope")
    assert res.code == 1 and "project path does not exist" in res.err


def test_project_path_that_is_a_file_is_refused(
    tmp_path: Path, sleeve: Callable[..., Result]
) -> None:
    (tmp_path / "f").write_text("x")
    res = sleeve("run", "--project", tmp_path / "f", "--dry-run", "--runtime", "bwrap")
    assert res.code == 1 and "not a directory" in res.err


def test_unwritable_sleeve_home_is_a_clear_error(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = sleeve("create", "--project", project, extra_env={"SLEEVE_HOME": str(blocker / "home")})
    assert res.code == 1 and f"cannot create {blocker / 'home'}" in res.err


def test_project_dir_deleted_by_hand_starts_over(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    sleeve("create", "--project", project)
    sleeve("create", "--project", project)
    shutil.rmtree(Project(project, home).dir)
    assert "`sleeve create`" in sleeve("slots", "--project", project).out
    assert json.loads(sleeve("create", "--project", project, "--json").out)["index"] == 1


def test_running_a_dead_slot_says_how_to_recreate_it(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    sleeve("create", "--project", project)
    sleeve("create", "--project", project)
    shutil.rmtree(Project(project, home).slot_path(1))
    res = sleeve("run", "--project", project, "--slot", "1", "--runtime", "bwrap", "--dry-run")
    assert res.code == 1 and "slot 1 is dead" in res.err and "`sleeve create`" in res.err


def test_docker_not_installed_names_the_runtime_and_suggests_bwrap(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    res = sleeve_proc(
        "run", "--project", project, "--runtime", "docker", extra_env={"PATH": "/nonexistent"}
    )
    assert res.code == 1
    assert "runtime docker: the docker client is not installed; try `--runtime bwrap`" in res.err


def test_docker_engine_not_answering_names_the_runtime_and_suggests_bwrap(
    tmp_path: Path, project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    require_executable("docker", "the client, not an engine; scripts/setup --test installs it")
    dead = f"unix://{tmp_path}/no-engine.sock"
    res = sleeve_proc(
        "run", "--project", project, "--runtime", "docker", extra_env={"DOCKER_HOST": dead}
    )
    assert res.code == 1
    assert "runtime docker: the Docker engine is not answering" in res.err
    assert "--runtime bwrap" in res.err


def test_without_an_engine_the_default_runtime_is_bwrap(
    tmp_path: Path, project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    dead = f"unix://{tmp_path}/no-engine.sock"
    res = sleeve_proc("run", "--project", project, "--dry-run", extra_env={"DOCKER_HOST": dead})
    assert res.code == 0, res.err
    assert " bwrap --unshare-pid" in res.out and "using the bwrap runtime" in res.err


def test_bwrap_missing_is_a_clear_error(project: Path, sleeve_proc: Callable[..., Result]) -> None:
    res = sleeve_proc(
        "run", "--project", project, "--runtime", "bwrap", extra_env={"PATH": "/nonexistent"}
    )
    assert res.code == 1 and "runtime bwrap: bwrap is not installed" in res.err


def test_state_files_are_private(home: Path, project: Path, sleeve: Callable[..., Result]) -> None:
    sleeve("create", "--project", project)
    proj = Project(project, home)
    for path in (home, proj.dir, proj.slot_path(1), proj.slot_path(1) / ".claude"):
        assert oct(path.stat().st_mode & 0o777) == "0o700", path
    assert oct((proj.dir / ".project_container_counter").stat().st_mode & 0o777) == "0o600"
    assert os.access(proj.dir / "profiles.ini", os.R_OK)


def test_rm_in_a_project_never_created_creates_nothing(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("rm", "1", "--project", project)
    assert res.code == 1 and "no slot 1" in res.err
    assert not Project(project, home).dir.exists()


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("existing", [False, True], ids=["new-home", "home-0755"])
def test_every_dir_under_sleeve_home_is_0700_and_every_file_0600_under_umask_022(
    existing: bool, home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """Intermediate dirs (`projects/`, `instances/`, `logs/`) too, and a loose home is tightened."""
    if existing:
        home.mkdir(mode=0o755)
        home.chmod(0o755)
    assert sleeve("create", "--project", project).code == 0
    run = Run("r1", Project(project, home).key, 1, "x", "bwrap", "shell")
    StateStore(home).upsert(run)
    pid, _ = spawn_detached([sys.executable, "-c", ""], os.environ, home / "logs" / "r1.log")
    os.waitpid(pid, 0)
    modes = {p: oct(p.stat().st_mode & 0o777) for p in [home, *home.rglob("*")]}
    assert {"projects", "instances", "logs", "state.json"} <= {p.name for p in modes}
    wrong = {p: m for p, m in modes.items() if m != ("0o700" if p.is_dir() else "0o600")}
    assert not wrong


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the home to another user")
def test_a_sleeve_home_of_another_user_is_left_as_it_is(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    home.mkdir()
    home.chmod(0o755)
    os.chown(home, 65534, 65534)
    assert sleeve("create", "--project", project).code == 0
    assert oct(home.stat().st_mode & 0o777) == "0o755"
