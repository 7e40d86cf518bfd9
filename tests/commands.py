"""The `sidecar` command line as tests run it: `sidecar run` with a configuration it must refuse
(it exits by itself, or the test fails), and the debugging commands (`status`, `approvals`, ...)
against a running sidecar, as a person would run them with `docker exec`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import PYTHONPATH, REPO, Sidecar

# The admin token of the sidecars the command tests start; `sidecar_cmd` sends it by default.
CLI_TOKEN = "cli-token-abcdef123456"


def run_until_exit(
    argv: list[str], env: dict[str, str], timeout: float = 30, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run a sidecar (or anything) that must exit by itself, in its own session: one that
    wrongly keeps running fails the test and is stopped with SIGTERM, which init forwards to
    everything it started (the supervisor's group, tmux, ttyd)."""
    with subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            out, err = proc.communicate(timeout=15)
            pytest.fail(f"{argv[-1]} did not exit by itself: {err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_sidecar(
    env: dict[str, str],
    tmp: Path,
    *,
    argv_prefix: tuple[str, ...] = (),
    python: str = sys.executable,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """`sidecar run` with `env` (which names the sleeve, or leaves it out on purpose), its state
    dir and workspace under `tmp`, run by `python` after `argv_prefix`: a configuration it must
    refuse, so it exits by itself before it listens."""
    full = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": PYTHONPATH,
        "SIDECAR_STATE_DIR": str(tmp / "state"),
        "SIDECAR_WORKSPACE": str(tmp / "ws"),
        "SIDECAR_HOST": "127.0.0.1",
        "SIDECAR_PORT": "1",  # never reached: every configuration given here is refused first
        **env,
    }
    return run_until_exit([*argv_prefix, python, "-m", "sidecar", "run"], full, **popen)


def sidecar_cmd(
    sc: Sidecar,
    *args: str,
    stdin: str | None = None,
    token: str | None = CLI_TOKEN,
    env_extra: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`sidecar ARGS...` against `sc`, with `token` (None: none) as SIDECAR_TOKEN and
    `env_extra` added to its environment."""
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "SIDECAR_PORT": str(sc.port),
        "SIDECAR_STATE_DIR": str(sc.state_dir),
        **(env_extra or {}),
    }
    if token:
        env["SIDECAR_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
