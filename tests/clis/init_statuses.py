"""Runs `sidecar.process.init.run_as_init(work)` and reports what `work` saw (one JSON line on
stdout).

`python init_statuses.py statuses DIR`: `work` keeps a stream of orphans dying (they re-parent
to the init and are reaped there) while it waits, concurrently, for `sh -c "exit 3"` through
`subprocess.run` (in a thread, as libtmux does it), for `sh -c "exit 5"` through asyncio's
`create_subprocess_exec`, and for a failing libtmux/tmux command (`has-session` of a missing
session on a private socket under DIR: exit 1). It exits 0 only if every status was exact, and
prints the mismatches otherwise.

`python init_statuses.py signal N`: `work` kills itself with signal N, every time init starts
it again.

The line printed last is `{"init_pid", "work_ppid", "code", ...}`; the process exits with the
code `run_as_init` returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import libtmux

from sidecar.process.init import Incarnation, run_as_init

ROUNDS = 100
# An orphan factory: double-forks until its stdin closes, then says how many it made and
# exits 4 (one more status to check).
ORPHANS = """
import os, select, sys
made = 0
while not select.select([0], [], [], 0)[0]:
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            os._exit(0)
        os._exit(0)
    os.waitpid(pid, 0)
    made += 1
print(made, flush=True)
sys.exit(4)
"""


def statuses(tmp: Path) -> int:
    report = tmp / "report.json"

    def work(_: Incarnation) -> int:
        bad: list[str] = []
        factory = subprocess.Popen(
            [sys.executable, "-c", ORPHANS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        sock = tmp / "tmux.sock"
        server = libtmux.Server(socket_path=str(sock), config_file="/dev/null")
        server.cmd("new-session", "-d", "-s", "real", "sleep", "600")  # daemonizes: an orphan

        def threaded() -> None:
            for i in range(ROUNDS):
                got = subprocess.run(["sh", "-c", "exit 3"], check=False).returncode
                if got != 3:
                    bad.append(f"subprocess.run round {i}: {got} != 3")
                got = server.cmd("has-session", "-t", "nope").returncode
                if got != 1:
                    bad.append(f"libtmux has-session round {i}: {got} != 1")
                got = server.cmd("has-session", "-t", "real").returncode
                if got != 0:
                    bad.append(f"libtmux has-session real round {i}: {got} != 0")

        async def concurrently() -> None:
            async def exec_5() -> None:
                for i in range(ROUNDS):
                    proc = await asyncio.create_subprocess_exec("sh", "-c", "exit 5")
                    got = await proc.wait()
                    if got != 5:
                        bad.append(f"create_subprocess_exec round {i}: {got} != 5")

            await asyncio.gather(asyncio.to_thread(threaded), exec_5())

        asyncio.run(concurrently())
        server.kill()
        made, _ = factory.communicate("stop\n", timeout=30)
        if factory.returncode != 4:
            bad.append(f"orphan factory: {factory.returncode} != 4")
        report.write_text(
            json.dumps({"bad": bad, "orphans": int(made or 0), "work_ppid": os.getppid()})
        )
        return 0 if not bad else 1

    code = run_as_init(work)
    result = json.loads(report.read_text()) if report.exists() else {"bad": ["no report"]}
    print(json.dumps({"init_pid": os.getpid(), "code": code, **result}), flush=True)
    return code


def killed_by(signo: int) -> int:
    def work(incarnation: Incarnation) -> int:
        print(json.dumps({"work_ppid": os.getppid(), "restarts": incarnation.restarts}), flush=True)
        incarnation.release_signals()  # as the supervisor does once its handlers are in place
        os.kill(os.getpid(), signo)  # delivered before kill() returns: work never returns
        return 0

    code = run_as_init(work)
    print(json.dumps({"init_pid": os.getpid(), "code": code}), flush=True)
    return code


if __name__ == "__main__":
    if sys.argv[1] == "statuses":
        sys.exit(statuses(Path(sys.argv[2])))
    sys.exit(killed_by(signal.Signals(int(sys.argv[2]))))
