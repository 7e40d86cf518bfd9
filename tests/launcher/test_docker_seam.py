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

from sidecar.launcher.launch import free_port, home_label
from sidecar.launcher.slots import Project
from sidecar.launcher.state import RUNNING, Run, StateStore

from .helpers import Result

SECRET = "sk-ant-api03-TESTKEY-abcdefghij0123456789"


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

    (run_call,) = [c for c in docker.calls() if c["argv"][0] == "run"]
    assert ["docker", *run_call["argv"]] == shlex.split(dry.out)
    assert "ANTHROPIC_API_KEY" in run_call["env"]  # docker copies the value itself
    assert all(SECRET not in " ".join(c["argv"]) for c in docker.calls())

    name = run_call["argv"][run_call["argv"].index("--name") + 1]
    key = Project(project, home).key
    running = ps_line(name, "running", "Up 2 seconds", key, slot=1, port=port)
    runs = json.loads(sleeve_proc("ps", "--json", extra_env={**env, "FAKE_DOCKER_PS": running}).out)
    assert [(r["container"], r["status"], r["port"]) for r in runs] == [(name, RUNNING, port)]
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
