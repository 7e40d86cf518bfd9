"""stop_tree against real processes: what a tree forks while it is being stopped is stopped too.

The CLI here ignores SIGHUP and answers SIGTERM by forking a child that ignores both, the way a
CLI forks at the wrong moment: the child is born after stop_tree's first look at the tree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.core.proc import start_time
from sidecar.process.proctree import stop_tree
from tests.harness import wait_for
from tests.proctools import all_exited

FORKS_ON_SIGTERM = """
import os, signal, sys

def forked(*_):
    if os.fork() == 0:
        for sig in (signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        with open(sys.argv[1], "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        while True:
            signal.pause()

signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGTERM, forked)
print("ready", flush=True)
while True:
    signal.pause()
"""


@pytest.mark.timeout(30)
def test_a_child_forked_after_the_first_look_is_killed_with_the_tree(tmp_path: Path) -> None:
    children = tmp_path / "children"
    # Its own session, as a tmux pane's process is: the session is part of what stop_tree reads.
    cli = subprocess.Popen(
        [sys.executable, "-c", FORKS_ON_SIGTERM, str(children)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        assert cli.stdout is not None and cli.stdout.readline() == b"ready\n"
        stop_tree(cli.pid, start_time(cli.pid), grace=0.5)
        forked = wait_for(lambda: children.exists() and children.read_text().split(), timeout=5)
        assert cli.wait(5) == -9
        # The child's parent is gone; whoever reaps it now, it must not be running.
        wait_for(lambda: all_exited([int(forked[0])]), timeout=5, what="the late child gone")
    finally:
        for pid in [cli.pid, *map(int, children.read_text().split() if children.exists() else [])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        cli.wait()
        assert cli.stdout is not None
        cli.stdout.close()
