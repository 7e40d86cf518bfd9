"""The CLI's pid as the supervisor finds it under the pane's waiter: while the waiter reads the
CLI's environment it forks short-lived copies of itself, and one that has exited and is not yet
reaped (a zombie: no command line at all) is never taken for the CLI; nor is a live copy when the
waiter itself was looked at in the middle of its exec (no command line either: the test asks
right after Popen, as the supervisor asks right after tmux has forked the pane).

Real processes: the waiter script tmux runs in the pane, started by the test, with an env file.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil

from sidecar.pane.tmux import pane_command
from sidecar.process import pane_procs

LINES = 500  # each line of the env file is one fork of the waiter
# Without the zombie check, about one launch in five named a zombie here. The exec case is rarer:
# one launch of 40 named a copy of the waiter, in one run of nine with a test run beside it.
LAUNCHES = 40


async def test_the_cli_pid_is_the_cli_never_a_fork_of_the_waiter_that_exited(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "cli.env"
    env_file.write_text("".join(f"VAR_{n}=value {n}\n" for n in range(LINES)))
    argv = ["sleep", "300"]
    wrong = []
    for _ in range(LAUNCHES):
        waiter = subprocess.Popen(pane_command(argv, tmp_path / "status", env_file))
        try:
            pid = await pane_procs.cli_pid(waiter.pid)
            assert pid is not None
            try:
                named = psutil.Process(pid).cmdline()
            except psutil.NoSuchProcess:
                named = None
            if named != argv:
                wrong.append(named)
        finally:
            for child in psutil.Process(waiter.pid).children(recursive=True):
                child.kill()
            waiter.kill()
            waiter.wait()
    assert wrong == [], f"{len(wrong)} of {LAUNCHES} launches named another process: {wrong[:5]}"
