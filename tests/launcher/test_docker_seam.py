"""The docker runtime against a stand-in `docker` client (fake_docker.py; no engine runs here).

What is proven is the launcher's side of the seam: the executed argv is the dry-run argv,
secrets reach docker's environment but no argv, and a listing asks docker exactly once.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.contract import runtime_grace
from sidecar.core.loopback import free_port
from sidecar.launcher import engine
from sidecar.launcher.engine import home_label
from sidecar.launcher.slots import Project
from sidecar.launcher.state import RUNNING, Run, StateStore

from .helpers import RUN_ID, SECRET, Result


@dataclass
class FakeDocker:
    log: Path
    env: dict[str, str]

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def reset(self) -> None:
        self.log.unlink(missing_ok=True)


@pytest.fixture
def docker(tmp_path: Path) -> Iterator[FakeDocker]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    fake = Path(__file__).with_name("fake_docker.py")
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(fake))} "$@"\n'
    )
    script.chmod(0o755)
    log = tmp_path / "docker-calls.jsonl"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DOCKER_LOG": str(log)}
    yield FakeDocker(log, env)
    pids = Path(f"{log}.pids")
    for pid in pids.read_text().split() if pids.exists() else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def ps_line(name: str, state: str, status: str, key: str, *, slot: int, port: int) -> str:
    return f"{name}\t{state}\t{status}\t{key}\t{slot}\tabcd0123\t{port}\tshell\n"


def test_docker_run_executes_the_dry_run_argv_with_secrets_by_name_only(
    home: Path, project: Path, docker: FakeDocker, sleeve_proc: Callable[..., Result]
) -> None:
    port = free_port()
    args = ("run", "--project", project, "--runtime", "docker", "--port", str(port), "--goal", "g")
    env = {**docker.env, "ANTHROPIC_API_KEY": SECRET}
    dry = sleeve_proc(*args, "--dry-run", extra_env=env)
    assert dry.code == 0, dry.err
    res = sleeve_proc(*args, extra_env=env)
    assert res.code == 0, res.err
    assert f"http://127.0.0.1:{port}/" in res.out

    steps = [c for c in docker.calls() if c["argv"][0] in ("create", "cp", "start")]
    # The same lists but for the run's id (SLEEVE_NAME), new in each run.
    assert [[RUN_ID.sub("ID", w) for w in ["docker", *c["argv"]]] for c in steps] == [
        [RUN_ID.sub("ID", w) for w in shlex.split(line)] for line in dry.out.splitlines()
    ]
    run_call, copy, _ = steps
    assert "ANTHROPIC_API_KEY" in run_call["env"]  # docker copies the value itself
    assert all(SECRET not in " ".join(c["argv"]) for c in docker.calls())
    # The sleeve's token: a file copied in before the start, root's and private; in no argv.
    token = res.out.strip().rsplit("?token=", 1)[1]
    assert len(token) >= 32 and all(token not in " ".join(c["argv"]) for c in docker.calls())
    assert copy["tar"] == [["sleeve", "0o700", 0, 0], ["sleeve/token", "0o600", 0, len(token) + 1]]
    assert "SIDECAR_TOKEN_FILE=/run/sleeve/token" in run_call["argv"]

    name = run_call["argv"][run_call["argv"].index("--name") + 1]
    key = Project(project, home).key
    running = ps_line(name, "running", "Up 2 seconds", key, slot=1, port=port)
    runs = json.loads(sleeve_proc("ps", "--json", extra_env={**env, "FAKE_DOCKER_PS": running}).out)
    assert [(r["container"], r["status"], r["port"]) for r in runs] == [(name, RUNNING, port)]
    assert runs[0]["token"] == token  # again, for the owner of $SLEEVE_HOME
    assert token not in sleeve_proc("ps", extra_env={**env, "FAKE_DOCKER_PS": running}).out
    exited = ps_line(name, "exited", "Exited (137) 1 second ago", key, slot=1, port=port)
    runs = json.loads(sleeve_proc("ps", "--json", extra_env={**env, "FAKE_DOCKER_PS": exited}).out)
    assert [r["status"] for r in runs] == ["failed (code 137)"]


def test_listings_ask_docker_once_however_many_slots_run(
    home: Path, project: Path, docker: FakeDocker, sleeve_proc: Callable[..., Result]
) -> None:
    proj = Project(project, home)
    lines = ""
    for n in range(1, 6):
        assert sleeve_proc("create", "--project", project).code == 0
        name = proj.container_name(proj.slot_path(n).name)
        StateStore(home).upsert(
            Run(
                f"r{n}",
                proj.key,
                n,
                "x",
                "docker",
                "shell",
                port=9000 + n,
                container=name,
                status=RUNNING,
            )
        )
        lines += ps_line(name, "running", "Up 1 minute", proj.key, slot=n, port=9000 + n)
    env = {**docker.env, "FAKE_DOCKER_PS": lines}
    for listing in (("slots", "--project", project, "--json"), ("ps", "--json")):
        docker.reset()
        res = sleeve_proc(*listing, extra_env=env)
        assert res.code == 0, res.err
        calls = [c["argv"] for c in docker.calls()]
        assert len(calls) == 1 and calls[0][0] == "ps", calls
        assert f"label=sleeve.home={home_label(home)}" in calls[0]
    slots = json.loads(sleeve_proc("slots", "--project", project, "--json", extra_env=env).out)
    assert [s["running"] for s in slots["slots"]] == [True] * 5


HANG_TIMEOUT = 2.0  # what the wedged call gets instead of 20-120 s; the fake answers in ~0.1 s


@pytest.mark.parametrize(
    ("hang", "command", "expected"),
    [
        ("rm", "run", "`docker rm` did not answer in 2 s; try `--runtime bwrap`"),
        ("create", "run", "`docker create` did not answer in 2 s; try `--runtime bwrap`"),
        ("start", "run", "`docker start` did not answer in 2 s; try `--runtime bwrap`"),
        ("inspect", "run", "`docker inspect` did not answer in 2 s"),
        ("stop", "stop", "`docker stop` did not answer in 2 s"),
        ("image", "build", "`docker image inspect` did not answer in 2 s"),
    ],
)
def test_a_docker_call_that_never_answers_is_a_one_line_error(
    *,
    hang: str,
    command: str,
    expected: str,
    home: Path,
    project: Path,
    tmp_path: Path,
    docker: FakeDocker,
    sleeve: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wedged engine: the fake `docker` (the OS seam) never answers `hang`.

    In-process so the timeouts can be shortened; the client is found through PATH, so PATH
    is set for this process too.
    """
    for name in ("_TIMEOUT", "_RUN_TIMEOUT", "_STOP_MARGIN"):
        monkeypatch.setattr(engine, name, HANG_TIMEOUT)
    env = {**docker.env, "FAKE_DOCKER_HANG": hang}
    if command == "run":
        args: tuple[str | Path, ...] = ("run", "--project", project, "--runtime", "docker")
    elif command == "stop":
        proj = Project(project, home)
        name = proj.container_name(proj.slot_path(1).name)
        StateStore(home).upsert(
            Run("r1", proj.key, 1, "x", "docker", "shell", port=1, container=name, status=RUNNING)
        )
        env["FAKE_DOCKER_PS"] = ps_line(name, "running", "Up", proj.key, slot=1, port=1)
        args = ("stop", "1", "--project", project, "--grace", "0")
    else:
        (tmp_path / "Dockerfile").write_text("FROM scratch\n")
        args = ("build", "--context", tmp_path, "--file", tmp_path / "Dockerfile")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    res = sleeve(*args, extra_env=env)
    assert res.code == 1
    assert res.err.startswith("sleeve: runtime docker: ") and expected in res.err
    if hang != "inspect":  # there the start-up error adds the log's tail
        assert res.err.count("\n") == 1, res.err
    assert hang in [c["argv"][0] for c in docker.calls()]


def test_build_logs_build_arg_names_never_their_values(
    tmp_path: Path, docker: FakeDocker, sleeve_proc: Callable[..., Result]
) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\nARG TOKEN\n")
    res = sleeve_proc(
        "-v",
        "build",
        "--context",
        tmp_path,
        "--file",
        tmp_path / "Dockerfile",
        "--build-arg",
        f"TOKEN={SECRET}",
        extra_env=docker.env,
    )
    assert res.code == 0, res.err
    assert "building sleeve:latest: docker build" in res.err and "--build-arg TOKEN " in res.err
    assert SECRET not in res.err + res.out
    (build,) = [c["argv"] for c in docker.calls() if c["argv"][0] == "build"]
    assert f"TOKEN={SECRET}" in build  # docker itself still gets the value


def test_build_clis_is_the_clis_build_arg_checked_against_image_clis(
    tmp_path: Path, docker: FakeDocker, sleeve_proc: Callable[..., Result]
) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\nARG CLIS\n")
    (tmp_path / "image" / "clis" / "codex").mkdir(parents=True)
    (tmp_path / "image" / "clis" / "codex" / "package-lock.json").write_text("{}")
    args = ("build", "--context", tmp_path, "--file", tmp_path / "Dockerfile", "--clis")
    bad = sleeve_proc(*args, "codex,gemini-cli", extra_env=docker.env)
    assert bad.code == 1
    assert "no CLI gemini-cli" in bad.err and "known: claude-code, codex" in bad.err
    assert docker.calls() == [], "refused before any docker call"
    res = sleeve_proc(*args, "claude-code, codex,codex", extra_env=docker.env)
    assert res.code == 0, res.err
    (build,) = [c["argv"] for c in docker.calls() if c["argv"][0] == "build"]
    assert "CLIS=claude-code codex" in build
    both = sleeve_proc(*args, "codex", "--build-arg", "CLIS=codex", extra_env=docker.env)
    assert both.code == 1 and "give one" in both.err


def test_docker_stops_by_the_stop_grace_rule(
    home: Path, project: Path, docker: FakeDocker, sleeve_proc: Callable[..., Result]
) -> None:
    """The container's --stop-timeout (every `docker stop`, the engine's own at its shutdown
    too) and `sleeve stop`'s --time are the stop-grace rule for the sleeve's own
    SIDECAR_STOP_GRACE, which the chart and `sleeve manifest` use as well."""
    expected = runtime_grace(12.5)
    env = {**docker.env, "SIDECAR_STOP_GRACE": "12.5"}
    args = ("run", "--project", project, "--runtime", "docker", "--port", str(free_port()))
    assert sleeve_proc(*args, extra_env=env).code == 0
    [create] = [c["argv"] for c in docker.calls() if c["argv"][0] == "create"]
    assert create[create.index("--stop-timeout") + 1] == str(expected)
    name = create[create.index("--name") + 1]
    key = Project(project, home).key
    running = ps_line(name, "running", "Up 2 seconds", key, slot=1, port=1)
    docker.reset()
    stop = sleeve_proc(
        "stop", "1", "--project", project, extra_env={**env, "FAKE_DOCKER_PS": running}
    )
    assert stop.code == 0, stop.err
    [stopped] = [c["argv"] for c in docker.calls() if c["argv"][0] == "stop"]
    assert stopped == ["stop", "--time", str(expected), name]
    # A value the sidecar would refuse is refused before anything is created.
    docker.reset()
    args = ("run", "--project", project, "--runtime", "docker", "--port", str(free_port()))
    bad = sleeve_proc(*args, extra_env={**docker.env, "SIDECAR_STOP_GRACE": "soon"})
    assert bad.code == 1 and "SIDECAR_STOP_GRACE" in bad.err
    assert not [c for c in docker.calls() if c["argv"][0] == "create"]
