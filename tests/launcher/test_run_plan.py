"""`sleeve run --dry-run`: the argv each runtime would execute, its mount plan and env audit."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sidecar.core.proc import start_time
from sidecar.launcher.slots import COUNTER_FILE, Project, slot_chain
from sidecar.launcher.state import RUNNING, Run, StateStore

from .helpers import RUN_ID, SECRET, Result, mount_fields


def dry_run(sleeve: Callable[..., Result], project: Path, *args: str) -> tuple[list[str], str]:
    """The first command `sleeve run` would execute (docker: `docker create`, then it copies
    the token file in and starts the container), and the audit."""
    res = sleeve(
        "run", "--project", project, "--dry-run", *args, extra_env={"ANTHROPIC_API_KEY": SECRET}
    )
    assert res.code == 0, res.err
    return shlex.split(res.out.splitlines()[0]), res.err


def test_docker_argv_names_container_labels_and_publishes_on_loopback(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    goal = "fix $(rm -rf /) `x`"
    argv, audit = dry_run(sleeve, project, "--runtime", "docker", "--port", "18123", "--goal", goal)
    root = project.resolve()
    crc0, crc1 = slot_chain(root, 1)
    key = Project(root, home).key
    assert argv[:2] == ["docker", "create"]
    assert argv[argv.index("--name") + 1] == f"sleeve-{key}-{crc1}" and key.endswith(crc0)
    assert "--privileged" not in argv
    assert argv[argv.index("--publish") + 1] == "127.0.0.1:18123:8080"
    assert f"sleeve.project={key}" in argv and "sleeve.slot=1" in argv
    assert argv[-1] == "sleeve:latest"
    envs = [b for a, b in itertools.pairwise(argv) if a == "--env"]
    # The sleeve is named by its run, as `sleeve ps` names it (its dashboard shows that name).
    names = [e.removeprefix("SLEEVE_NAME=") for e in envs if e.startswith("SLEEVE_NAME=")]
    assert len(names) == 1 and RUN_ID.fullmatch(names[0]) and "SLEEVE_CLI=claude-code" in envs
    assert "SLEEVE_GOAL=fix $(rm -rf /) `x`" in envs
    assert "ANTHROPIC_API_KEY" in envs  # by name: docker takes the value from its own env
    assert SECRET not in " ".join(argv) and SECRET not in audit
    assert "ANTHROPIC_API_KEY" in audit and "SLEEVE_HOME" not in audit
    assert not home.exists(), "--dry-run creates nothing"


def test_docker_mounts_follow_the_plan_in_order(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    argv, _ = dry_run(sleeve, project, "--runtime", "docker")
    mounts = [(m["source"], m["target"]) for m in mount_fields(argv)]
    proj = Project(project.resolve(), home)
    slot, inst = proj.slot_path(1), home / "instances"
    targets = [t for _, t in mounts]
    assert targets == [
        "/workspace",
        "/home/sleeve/.claude",
        "/home/sleeve/.claude/projects",
        "/home/sleeve/.claude/history.jsonl",
        "/home/sleeve/.claude.json",
        "/home/sleeve/.config",
        "/home/sleeve/.cache",
        # The other CLIs' own folders, kept in the slot like `.claude`.
        "/home/sleeve/.codex",
        "/home/sleeve/.gemini",
        "/home/sleeve/.local/share/opencode",
    ]
    assert mounts[0][0] == str(project.resolve())
    assert mounts[1][0] == str(slot / ".claude") and mounts[4][0] == str(slot / ".claude.json")
    assert mounts[2][0].startswith(str(inst)) and mounts[3][0].endswith("history.jsonl")
    assert all(m.get("type") == "bind" and "readonly" not in m for m in mount_fields(argv))


def test_docker_network_host_binds_the_api_to_loopback_itself(
    project: Path, sleeve: Callable[..., Result]
) -> None:
    argv, _ = dry_run(
        sleeve, project, "--runtime", "docker", "--network", "host", "--port", "18124"
    )
    assert argv[argv.index("--network") + 1] == "host" and "--publish" not in argv
    envs = [b for a, b in itertools.pairwise(argv) if a == "--env"]
    assert {"SIDECAR_HOST=127.0.0.1", "SIDECAR_PORT=18124"} <= set(envs)


def test_bwrap_argv_runs_the_sidecar_as_pid_1_with_overlays_after_the_config_dir(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    argv, audit = dry_run(sleeve, project, "--runtime", "bwrap", "--shell", "--port", "18125")
    bw = argv[argv.index("--") + 1 :]  # after the waiter's own arguments
    assert bw[0] == "bwrap"
    assert {"--unshare-pid", "--as-pid-1", "--die-with-parent"} <= set(bw)
    assert "--unshare-net" not in bw and "--unshare-all" not in bw
    binds = [(bw[i + 1], bw[i + 2]) for i, w in enumerate(bw) if w == "--bind"]
    targets = [t for _, t in binds]
    assert targets.index("/home/sleeve/.claude") < targets.index("/home/sleeve/.claude/projects")
    assert targets.index("/home/sleeve/.claude") < targets.index(
        "/home/sleeve/.claude/history.jsonl"
    )
    assert binds[0] == (str(project.resolve()), "/workspace")
    assert bw.index("--tmpfs") < bw.index("--bind")  # the tmpfs home comes first
    ro = {bw[i + 1] for i, w in enumerate(bw) if w == "--ro-bind"}
    assert {"/usr", "/etc"} <= ro
    assert bw[-3:] == ["-m", "sidecar", "run"]
    waiter = argv[: argv.index("--")]
    assert (
        waiter[1:3] == ["-m", "sidecar.launcher.waiter"]
        and "--port=18125" in waiter
        and "--cli=shell" in waiter
    )
    assert SECRET not in " ".join(argv) and SECRET not in audit
    names = audit.split("env names:")[1].split()
    assert {"ANTHROPIC_API_KEY", "SIDECAR_PORT", "SLEEVE_NAME", "HOME", "PATH"} <= set(names)
    assert "TTYD_PORT" not in names  # ttyd on its unix socket
    assert "SIDECAR_TOKEN_FILE" in names and "SIDECAR_TOKEN" not in names
    assert "SLEEVE_HOME" not in names and "SSL_CERT_FILE" not in names


def test_dry_run_with_a_taken_port_is_refused(project: Path, sleeve: Callable[..., Result]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        res = sleeve(
            "run", "--project", project, "--runtime", "bwrap", "--port", str(port), "--dry-run"
        )
    assert res.code == 1 and f"port {port} on 127.0.0.1 is already in use" in res.err


def test_slot_option_and_all_busy_message(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """Two slots, both with a live run recorded: `run` says all are busy; `--slot 3` is unknown."""
    sleeve("create", "--project", project)
    sleeve("create", "--project", project)
    key = Project(project.resolve(), home).key
    me = psutil.Process(os.getpid())  # a live process with a known start time
    for n in (1, 2):
        StateStore(home).upsert(
            Run(
                f"r{n}",
                key,
                n,
                "x",
                "bwrap",
                "shell",
                pid=me.pid,
                pid_start=start_time(me.pid),
                status=RUNNING,
            )
        )
    res = sleeve("run", "--project", project, "--runtime", "bwrap", "--dry-run")
    assert res.code == 1 and "all 2 slots are running; `sleeve create` adds one" in res.err
    res = sleeve("run", "--project", project, "--runtime", "bwrap", "--dry-run", "--slot", "2")
    assert res.code == 1 and "slot 2 is already running" in res.err
    res = sleeve("run", "--project", project, "--runtime", "bwrap", "--dry-run", "--slot", "3")
    assert res.code == 1 and "no slot 3" in res.err
    slots = json.loads(sleeve("slots", "--project", project, "--json").out)["slots"]
    assert [s["running"] for s in slots] == [True, True]


def snapshot(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every path under `root` (and itself) with its mode, mtime and content (atime aside)."""
    found = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
        found[str(path.relative_to(root))] = (st.st_mode, st.st_mtime_ns, data)
    return found


@pytest.mark.parametrize("state", ["stale", "corrupt"])
def test_dry_run_writes_nothing_even_where_it_would_repair(
    state: str,
    home: Path,
    project: Path,
    sleeve: Callable[..., Result],
    sleeve_proc: Callable[..., Result],
) -> None:
    """A corrupt counter and a state.json that reconciling would rewrite (a recorded run whose
    process is gone) or set aside: the dry run warns, and $SLEEVE_HOME stays byte-for-byte."""
    for _ in range(2):
        sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    (proj.dir / COUNTER_FILE).write_text("garbage")
    if state == "stale":
        gone = subprocess.Popen([sys.executable, "-c", ""])
        gone.wait()
        StateStore(home).upsert(
            Run("r1", proj.key, 1, "x", "bwrap", "shell", pid=gone.pid, status=RUNNING)
        )
    else:
        (home / "state.json").write_bytes(b'{"runs": [')
    before = snapshot(home)
    res = sleeve_proc("run", "--project", project, "--runtime", "bwrap", "--dry-run")
    assert res.code == 0, res.err
    assert "recomputed 2 from the slot directories" in res.err
    if state == "corrupt":
        assert "state.json is unreadable" in res.err
    assert snapshot(home) == before
