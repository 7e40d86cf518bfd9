"""`sleeve run` closed and least privileged: a token per sleeve (unless the caller gave one),
handed in as a file and in no argv; the docker CLI runs as the invoking user with three
capabilities; resource limits for both runtimes."""

from __future__ import annotations

import itertools
import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sidecar.core.loopback import free_port
from sidecar.launcher.bwrap import systemd_problem, systemd_scope
from sidecar.launcher.docker import DOCKER_CAPS, docker_argv, docker_command
from sidecar.launcher.plan import Limits, RunPlan
from tests.harness import http

from .helpers import Result


def plan(tmp_path: Path, **kw: object) -> RunPlan:
    base: dict[str, object] = {
        "name": "sleeve-p_0-1",
        "project_key": "p_0",
        "home_label": "h",
        "slot_index": 1,
        "slot_id": "1",
        "workspace": tmp_path / "proj",
        "slot_dir": tmp_path / "slot",
        "instance_dir": tmp_path / "inst",
        "cli": "claude-code",
        "goal": None,
        "port": 18000,
    }
    return RunPlan(**{**base, **kw})  # type: ignore[arg-type]


def envs(argv: list[str]) -> dict[str, str]:
    flags = [b for a, b in itertools.pairwise(argv) if a == "--env"]
    return dict(f.split("=", 1) if "=" in f else (f, "") for f in flags)


def test_docker_runs_the_cli_as_the_invoking_user_with_three_capabilities(tmp_path: Path) -> None:
    token = "tok-" + "x" * 40
    p = plan(tmp_path, user=(1001, 1002), tokens={"SIDECAR_TOKEN": token})
    argv = docker_argv(p)
    assert argv[:2] == ["docker", "create"]
    assert argv[argv.index("--user") + 1] == "0:0"  # the sidecar starts as root ...
    assert envs(argv)["SIDECAR_USER"] == "1001:1002"  # ... and runs the CLI as the user
    assert envs(argv)["SIDECAR_USER_HOME"] == "/home/sleeve"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    adds = [b for a, b in itertools.pairwise(argv) if a == "--cap-add"]
    assert adds == list(DOCKER_CAPS) == ["SETUID", "SETGID", "KILL"]
    assert argv[argv.index("--security-opt") + 1] == "no-new-privileges"
    home = argv[argv.index("--tmpfs") + 1]
    assert home.startswith("/home/sleeve:") and "uid=1001,gid=1002,mode=0700" in home
    assert envs(argv)["SIDECAR_TOKEN_FILE"] == "/run/sleeve/token"
    command = docker_command(p, {})
    assert command.then == (
        ["docker", "cp", "-", "sleeve-p_0-1:/run"],
        ["docker", "start", "sleeve-p_0-1"],
    )
    assert all(token not in " ".join(step) for step in command.steps)
    assert token.encode() in command.stdin[1]  # the tar `docker cp -` reads from its stdin
    # A root caller: everything stays root's, as before; no capability change.
    root = docker_argv(plan(tmp_path))
    assert "SIDECAR_USER" not in envs(root) and "--cap-drop" not in root


def test_limits_become_the_engines_flags_and_a_systemd_scope_for_bwrap(tmp_path: Path) -> None:
    limits = Limits(cpus=1.5, memory=512 << 20, pids=100)
    argv = docker_argv(plan(tmp_path, limits=limits))
    assert argv[argv.index("--cpus") + 1] == "1.5"
    assert argv[argv.index("--memory") + 1] == str(512 << 20)
    assert argv[argv.index("--pids-limit") + 1] == "100"
    scope = systemd_scope(limits)
    assert scope[0] == "systemd-run" and "--scope" in scope and scope[-1] == "--"
    props = [b for a, b in itertools.pairwise(scope) if a == "--property"]
    assert props == ["CPUQuota=150%", f"MemoryMax={512 << 20}", "TasksMax=100"]
    assert systemd_scope(Limits()) == []
    assert systemd_problem(tmp_path) == "this machine does not run systemd"


def test_the_limit_options_reach_the_docker_argv(
    project: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve(
        "run", "--project", project, "--runtime", "docker", "--dry-run",
        "--cpus", "2", "--memory", "1g", "--pids-limit", "64",
    )  # fmt: skip
    assert res.code == 0, res.err
    argv = shlex.split(res.out.splitlines()[0])
    assert [argv[argv.index(f) + 1] for f in ("--cpus", "--memory", "--pids-limit")] == [
        "2",
        str(1 << 30),
        "64",
    ]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--cpus", "0"), "--cpus 0 must be a positive number"),
        (("--cpus", "nan"), "must be a positive number"),
        (("--memory", "lots"), "give a size such as 512m"),
        (("--memory", "1k"), "below Docker's minimum of 6m"),
        (("--memory", "12x"), "give a size such as 512m"),
        (("--pids-limit", "0"), "--pids-limit 0 must be at least 1"),
    ],
)
def test_bad_limits_are_refused(
    project: Path, sleeve: Callable[..., Result], args: tuple[str, ...], needle: str
) -> None:
    res = sleeve("run", "--project", project, "--runtime", "docker", "--dry-run", *args)
    assert res.code == 1 and needle in res.err, res.err


def test_bwrap_limits_without_systemd_are_refused_with_the_reason(
    project: Path, sleeve: Callable[..., Result]
) -> None:
    if systemd_problem() is None:
        pytest.skip("this machine runs systemd: the scope would be made")
    res = sleeve("run", "--project", project, "--runtime", "bwrap", "--dry-run", "--cpus", "1")
    assert res.code == 1
    assert "need a systemd scope" in res.err and "does not run systemd" in res.err


@pytest.mark.parametrize("how", ["variable", "file"])
def test_the_callers_own_token_is_used_and_handed_in_as_a_file(
    how: str, tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    mine = "my-own-token-" + "y" * 20
    extra = {"SIDECAR_TOKEN": mine}
    if how == "file":
        (tmp_path / "tok").write_text(mine + "\n")
        extra = {"SIDECAR_TOKEN_FILE": str(tmp_path / "tok")}
    res = sleeve("run", "--project", project, "--runtime", "docker", "--dry-run", extra_env=extra)
    assert res.code == 0, res.err
    assert mine not in res.out + res.err
    argv = shlex.split(res.out.splitlines()[0])
    assert envs(argv)["SIDECAR_TOKEN_FILE"] == "/run/sleeve/token"
    assert "SIDECAR_TOKEN" not in envs(argv)  # never passed through by name either


def test_a_token_and_its_file_together_are_refused(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    (tmp_path / "tok").write_text("a\n")
    extra = {"SIDECAR_TOKEN": "b", "SIDECAR_TOKEN_FILE": str(tmp_path / "tok")}
    res = sleeve("run", "--project", project, "--runtime", "docker", "--dry-run", extra_env=extra)
    assert res.code == 1 and "SIDECAR_TOKEN and SIDECAR_TOKEN_FILE are both set" in res.err


def _status(url: str, token: str | None) -> int:
    return http("GET", url + "status", timeout=5, token=token)[0]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_a_bwrap_sleeve_is_closed_with_its_generated_token_in_no_argv_or_environment(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    port = free_port()
    args = ("run", "--project", str(project), "--runtime", "bwrap", "--shell", "--port", str(port))
    res = sleeve_proc(*args, "--wait", "40")
    waiter = None
    try:
        assert res.code == 0, res.err
        url, _, token = res.out.strip().rsplit(" ", 1)[1].partition("?token=")
        assert url == f"http://127.0.0.1:{port}/" and len(token) >= 32
        assert _status(url, None) == 401
        assert _status(url, "wrong") == 401
        assert _status(url, token) == 200
        (run,) = json.loads(sleeve_proc("ps", "--json").out)
        assert run["token"] == token
        assert token not in sleeve_proc("ps").out
        waiter = psutil.Process(run["pid"])
        for proc in [waiter, *waiter.children(recursive=True)]:
            for what in ("cmdline", "environ"):
                data = Path(f"/proc/{proc.pid}/{what}").read_bytes()
                assert token.encode() not in data, (proc.name(), what)
    finally:
        if waiter is not None:
            assert sleeve_proc("stop", "1", "--project", str(project)).code == 0
