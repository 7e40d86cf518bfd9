"""The parent of a detached bwrap sleeve: it forwards stop signals and records the exit code.

`sleeve run --runtime bwrap` spawns `python -m sidecar.launcher.waiter ARGS -- bwrap ...` in a
session of its own. bwrap's `--die-with-parent` ties the sandbox to this process, and its exit
status lands in state.json, so `sleeve ps` can say `completed` / `failed (code N)` later; a
waiter killed before it could write leaves `failed (vanished)`, which is then the truth.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import psutil

from sidecar.core.proc import start_time
from sidecar.launcher.state import RUNNING, Run, StateStore

logger = logging.getLogger(__name__)

MODULE = "sidecar.launcher.waiter"
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
WATCHED = STOP_SIGNALS | {signal.SIGCHLD}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(message)  # so a stranger's cmdline in find_waiters is just skipped


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=MODULE)
    parser.add_argument("--home", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--slot", type=int, required=True)
    parser.add_argument("--slot-id", required=True)
    parser.add_argument("--cli", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", default=None)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def waiter_argv(python: str, run: Run, home: Path, command: Sequence[str]) -> list[str]:
    """The argv `sleeve run` executes: this waiter, then the runtime's own argv after `--`."""
    # `--opt=value`: a value that starts with `-` (a CLI name, say) stays a value.
    return [
        python, "-m", MODULE,
        f"--home={home}", f"--run-id={run.id}", f"--project={run.project}",
        f"--slot={run.slot}", f"--slot-id={run.slot_id}", f"--cli={run.cli}",
        f"--port={run.port}", f"--log={run.log}",
        "--", *command,
    ]  # fmt: skip


def _template(args: argparse.Namespace) -> Run:
    # A waiter runs bwrap sleeves only: "bwrap" is `Bwrap.name` (bwrap.py, which imports us).
    return Run(
        id=args.run_id, project=args.project, slot=args.slot, slot_id=args.slot_id,
        runtime="bwrap", cli=args.cli, port=args.port, log=args.log,
    )  # fmt: skip


def _forward_stop(bwrap: psutil.Process) -> None:
    """SIGTERM the sandbox's PID 1 (bwrap's child): bwrap itself forwards no signals."""
    try:
        targets = bwrap.children() or [bwrap]  # still setting up: bwrap's death ends it too
    except psutil.NoSuchProcess:
        return
    for proc in targets:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGTERM)
            logger.info("forwarded SIGTERM to pid %d", proc.pid)


def main(argv: Sequence[str] | None = None) -> int:
    # `sleeve run` spawns us with these signals already blocked (so a stop sent while Python
    # starts up waits for us instead of killing us); block them here too for other callers.
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    logging.basicConfig(level=logging.INFO, format="sleeve-waiter: %(message)s", stream=sys.stderr)
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        logger.error("no command after --")
        return 2
    # The child must not inherit our blocked mask: the sidecar needs its SIGTERM.
    pid = os.posix_spawnp(
        command[0],
        command,
        os.environ,
        file_actions=[(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
        setsigmask=(),
    )
    logger.info("started pid %d: %s", pid, command[0])
    bwrap = psutil.Process(pid)
    stops = forwarded = 0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if stops > forwarded:
            forwarded = stops
            _forward_stop(bwrap)
            continue  # the child may have exited already; look before waiting again
        info = signal.sigtimedwait(WATCHED, 5.0)  # the timeout is only a safety net
        if info is not None and info.si_signo != signal.SIGCHLD:
            stops += 1
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # death by signal, reported the shell's way
        code = 128 - code
    logger.info("pid %d exited with %d", pid, code)
    store = StateStore(Path(args.home))
    store.finish(args.run_id, code, _template(args), stop_requested=stops > 0)
    return 0


def find_waiters(home: Path) -> list[Run]:
    """Runs of this `$SLEEVE_HOME` whose waiter is alive, read from the process table."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if MODULE not in cmdline[1:3]:
            continue
        try:
            args, _ = build_parser().parse_known_args(cmdline[cmdline.index(MODULE) + 1 :])
        except ValueError:  # a cmdline our parser rejects is not one of ours
            continue
        if Path(args.home) != home:
            continue
        run = _template(args)
        run.pid, run.pid_start, run.status, run.adopted = (
            proc.pid,
            start_time(proc.pid),
            RUNNING,
            True,
        )
        found.append(run)
    return found


if __name__ == "__main__":
    raise SystemExit(main())
