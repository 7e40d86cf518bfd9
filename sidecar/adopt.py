"""Taking over after a crash: the supervisor's state saved on every change (`sidecar.persist`),
and what a supervisor started again does with what it finds — the state file a dead one left,
checked against what really runs on the state dir's tmux socket.

The rule: adopt only what the record names exactly (tmux server and pane process by pid and
start time, the pane's argv by digest, the CLI's argv as the registry has it for the recorded
CLI); a record that does not match is no record (fresh start), never a wrong adoption.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar import persist
from sidecar.persist import ProcRef, SupervisorState, cmdline_digest
from sidecar.proc import start_time
from sidecar.proctree import stop_tree
from sidecar.states import ProcState, ProcStatus
from sidecar.tmux import PaneInfo, Tmux, fatal_pane_argv, recreate_socket

if TYPE_CHECKING:
    from sidecar.clis import CLIDef
    from sidecar.config import Config
    from sidecar.ttyd_runner import TtydRunner

log = logging.getLogger(__name__)


class Plan(Enum):
    FRESH = "fresh start"  # as at a first start; whatever runs on the socket is stopped first
    ADOPT = "adopt"  # take over the pane and the CLI in it as they are
    RELAUNCH = "relaunch"  # same tmux server; start the recorded CLI in the pane (resume argv)
    HEAL = "heal"  # the tmux server is gone: a new session with the recorded CLI (resume argv)


@dataclass(frozen=True)
class Decision:
    plan: Plan
    why: str  # for the one log line per adoption


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _server_is(record: SupervisorState, live: PaneInfo) -> bool:
    return record.tmux is not None and record.tmux == ProcRef.of(live.server_pid)


def _launched(record: SupervisorState, live: PaneInfo) -> bool:
    """The pane runs exactly the command the record was about to start."""
    return not live.dead and cmdline_digest(live.pane_pid) == record.pane_command


def decide(
    record: SupervisorState | None,
    found: str,
    init: ProcRef | None,
    live: PaneInfo | None,
    argvs: Collection[tuple[str, ...]],
) -> Decision:
    """`record` as loaded (None: `found` says why), this sidecar's init, the pane tmux reports on
    our socket (None: no server or session), and the argvs the recorded CLI may have run with."""
    if record is None:
        return Decision(Plan.FRESH, found)
    if init is None or record.init != init:
        return Decision(Plan.FRESH, "state file from another sidecar run")
    if record.argv not in argvs:
        return Decision(Plan.FRESH, f"state file from another CLI than {record.cli!r}")
    if record.cli_state == ProcState.STARTING.value:
        # The crash came between saving the launch and saving its result.
        # Into a new server (recorded without one) or into the recorded server.
        server_ok = live is not None and (record.tmux is None or _server_is(record, live))
        if live is not None and server_ok and _launched(record, live):
            return Decision(Plan.ADOPT, "the CLI being started when it crashed runs")
        if live is None:
            return Decision(Plan.HEAL, "tmux server gone; the CLI was being started")
        if _server_is(record, live):
            return Decision(Plan.RELAUNCH, "the CLI was being started and is not running yet")
        return Decision(Plan.FRESH, "another tmux server than the one recorded")
    if live is None:
        return Decision(Plan.HEAL, "tmux server gone")
    if not _server_is(record, live):
        return Decision(Plan.FRESH, "another tmux server than the one recorded")
    if record.pane is None or live.pane_pid != record.pane.pid:
        return Decision(Plan.FRESH, "another pane process than the one recorded")
    if not live.dead:
        if not record.pane.alive() or cmdline_digest(live.pane_pid) != record.pane_command:
            return Decision(Plan.FRESH, "the pane runs another command than the one recorded")
        cli = record.cli_pid
        if cli is not None and cli.alive() and _ppid(cli.pid) != live.pane_pid:
            return Decision(Plan.FRESH, "the recorded CLI pid is not the pane's CLI")
    return Decision(Plan.ADOPT, "state file matches the running tmux server and pane")


SOCKET_BACK_WITHIN = 1.0  # seconds tmux gets to recreate a deleted socket on SIGUSR1


def _found(live: PaneInfo | None) -> str:
    return "no tmux session" if live is None else f"tmux {live.server_pid} pane {live.pane_pid}"


class Adopting:
    """The Supervisor's part that saves its state and takes over after a crash (a mixin: what
    is declared below is the Supervisor's own)."""

    if TYPE_CHECKING:
        config: Config
        registry: dict[str, CLIDef]
        tmux: Tmux
        ttyd: TtydRunner
        cli_name: str
        cli: ProcStatus
        pane: PaneInfo | None
        warnings: list[str]
        restarts: int
        state_file: Path
        _pane_started: float | None
        _resleeve_move: tuple[str, str] | None
        _stopping: bool
        _gen: int
        _backoff_n: int
        _restart_due: float | None
        _backoff_task: asyncio.Task[None] | None
        _init: ProcRef | None
        _saved: bytes
        _argv: tuple[str, ...]
        _resume: bool
        _pane_command: str
        _server: ProcRef | None
        _cli_ref: ProcRef | None
        _orphan: ProcRef | None

        def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...
        def _watch_pid(self, key: str, pid: int, callback: Callable[[], object]) -> None: ...
        async def _launch_cli(self, *, resume: bool, fresh_server: bool) -> None: ...
        async def _stop_pane_tree(self) -> None: ...
        async def _on_cli_exit(self, gen: int) -> None: ...
        async def _on_tmux_exit(self, server_pid: int) -> None: ...
        async def _restart_after(self, delay: float, gen: int) -> None: ...
        async def _cli_pid(self, waiter: int) -> int | None: ...
        async def _finish_resleeve(self, previous: str, name: str, *, stop_first: bool) -> None: ...

    def _save(self) -> None:
        """Write the state file when something in it changed (never on a timer). A write that
        fails costs only the adoption after a crash (the next supervisor starts afresh)."""
        if self._init is None:
            return
        pane = self.pane
        started = self._pane_started
        record = SupervisorState(
            init=self._init,
            cli=self.cli_name,
            cli_state=self.cli.state.value,
            argv=self._argv,
            resume=self._resume,
            pane_command=self._pane_command,
            tmux=self._server,
            pane=ProcRef(pane.pane_pid, started) if pane and started is not None else None,
            cli_pid=self._cli_ref,
            exit_code=self.cli.exit_code,
            reason=self.cli.reason,
            started_at=self.cli.started_at,
            backoff_n=self._backoff_n,
            restart_due=self._restart_due,
            resleeve_from=self._resleeve_move[0] if self._resleeve_move else None,
            resleeve_to=self._resleeve_move[1] if self._resleeve_move else None,
            stopping=self._stopping,
            ttyd=self.ttyd.process,
            warnings=tuple(self.warnings),
        )
        data = persist.encode(record)
        if data == self._saved:
            return
        try:
            persist.write_atomic(self.state_file, data)
        except OSError as exc:
            log.warning("state file %s not written: %s", self.state_file, exc)
            return
        self._saved = data

    async def _find_pane(self, record: SupervisorState | None) -> PaneInfo | None:
        """The pane on our socket. A socket deleted while no supervisor watched is made again
        first, when the recorded tmux server still runs."""
        sock = self.config.paths.tmux_socket
        server = record.tmux if record is not None else None
        if not sock.exists() and server is not None and server.alive():
            recreate_socket(server.pid)
            deadline = time.monotonic() + SOCKET_BACK_WITHIN
            # A file appearing has no event to wait on (no inotify here): polled, bounded.
            while not sock.exists() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        return await asyncio.to_thread(self.tmux.find_pane)

    def _argvs(self, record: SupervisorState) -> set[tuple[str, ...]]:
        """The argvs the recorded CLI may have been started with."""
        cli = self.registry.get(record.cli)
        argvs = {cli.command, *([cli.resume] if cli.resume else [])} if cli else set()
        if record.cli_state == ProcState.FATAL.value and record.reason is not None:
            argvs.add(fatal_pane_argv(record.reason))
        return argvs

    async def _take_over(self, record: SupervisorState | None, found: str) -> None:
        """After a crash: adopt what the state file names if it matches what runs, else heal
        or start afresh (caller holds `_cli_lock`). Logs one line: what was found, what was
        adopted or started, and why."""
        live = await self._find_pane(record)
        argvs = self._argvs(record) if record is not None else set()
        decision = decide(record, found, self._init, live, argvs)
        plan = decision.plan
        if plan is Plan.FRESH or record is None:
            if live is not None:
                # Not ours to adopt, but on our socket: stopped, never left running.
                await stop_tree(live.pane_pid, start_time(live.pane_pid), self.config.stop_grace)
            await self._launch_cli(resume=False, fresh_server=True)
        else:
            self._backoff_n = record.backoff_n
            if plan is Plan.HEAL:
                if record.pane is not None:
                    # A CLI that ignores SIGHUP outlives its tmux server.
                    await stop_tree(record.pane.pid, record.pane.start, self.config.stop_grace)
                self.cli_name = record.resleeve_to or record.cli
                await self._launch_cli(resume=True, fresh_server=True)
            elif plan is Plan.RELAUNCH:
                assert live is not None
                self._take_pane(live, record.pane)
                await self._stop_pane_tree()
                self.cli_name = record.resleeve_to or record.cli
                await self._launch_cli(resume=record.resume, fresh_server=False)
            else:
                assert live is not None
                await self._adopt(record, live)
        log.warning(
            "supervisor restart %d: %s (%s; found %s): CLI %s %s, pid %s; ttyd restarted",
            self.restarts,
            "adopted" if plan is Plan.ADOPT else plan.value,
            decision.why,
            _found(live),
            self.cli_name,
            self.cli.state.value,
            self.cli.pid,
        )
        if record is not None and plan is not Plan.FRESH and record.resleeve_to is not None:
            # A resleeve the dead supervisor began is finished, never undone half way: the
            # old CLI's stop is done again (and the new one started) unless it was over.
            stop_first = plan is Plan.ADOPT and record.cli_state == ProcState.STOPPING.value
            previous = record.resleeve_from or record.cli
            log.warning("finishing the resleeve %s -> %s", previous, record.resleeve_to)
            await self._finish_resleeve(previous, record.resleeve_to, stop_first=stop_first)

    def _take_pane(self, live: PaneInfo, recorded: ProcRef | None) -> None:
        """Make `live` our pane and watch its tmux server."""
        self.pane = live
        same = recorded is not None and recorded.pid == live.pane_pid
        self._pane_started = recorded.start if same and recorded else start_time(live.pane_pid)
        self._server = ProcRef.of(live.server_pid)
        self._watch_server(live.server_pid)

    async def _adopt(self, record: SupervisorState, live: PaneInfo) -> None:
        """Take over the pane and the CLI in it as they are: the CLI never notices."""
        self._take_pane(live, record.pane)
        self.cli_name = record.cli
        self._argv, self._resume = record.argv, record.resume
        self._pane_command = record.pane_command
        self._gen += 1
        gen = self._gen
        state = ProcState(record.cli_state)
        if state is ProcState.STARTING:
            # The launch went through but was not recorded: the CLI has just started.
            state = ProcState.RUNNING
            pid = await self._cli_pid(live.pane_pid)
            self._cli_ref = ProcRef.of(pid)
            self.cli = ProcStatus(state, pid=pid, started_at=time.monotonic())
        elif state in (ProcState.RUNNING, ProcState.STOPPING):
            if state is ProcState.STOPPING and record.resleeve_to is None:
                state = ProcState.RUNNING  # only a resleeve leaves that state saved
            self._cli_ref = record.cli_pid
            pid = record.cli_pid.pid if record.cli_pid else None
            self.cli = ProcStatus(state, pid=pid, started_at=record.started_at)
        else:
            # EXITED/BACKOFF/FATAL: the pane shows why; a pending restart comes when it was due.
            self.cli = ProcStatus(state, exit_code=record.exit_code, reason=record.reason)
        if state is ProcState.RUNNING and live.dead:
            # The CLI ended while no supervisor was watching: its exit is handled now (not by
            # a pidfd: the dead pane's pid may belong to another process by now).
            self._spawn(self._on_cli_exit(gen), "cli-exit")
        elif state is ProcState.RUNNING:
            # Fires at once if the CLI ends between the check and now.
            self._watch_pid(
                "cli", live.pane_pid, lambda: self._spawn(self._on_cli_exit(gen), "cli-exit")
            )
        elif state is ProcState.BACKOFF:
            due = record.restart_due or time.monotonic()
            self._restart_due = due
            delay = max(0.0, due - time.monotonic())
            self._backoff_task = self._spawn(self._restart_after(delay, gen), "backoff")
        self._save()

    async def _take_over_to_stop(self, record: SupervisorState | None) -> None:
        """Shut down at once: take what runs (the pane on our socket, else the recorded one,
        whose CLI may outlive a dead tmux server) for `shutdown` to stop; start nothing."""
        live = await self._find_pane(record)
        if live is not None:
            self._take_pane(live, record.pane if record is not None else None)
        elif record is not None and record.pane is not None:
            self._orphan = record.pane
        if record is not None:
            self.cli_name = record.cli
        self.cli = ProcStatus(ProcState.STOPPING)
        log.warning(
            "supervisor restart %d: shutting down at once (found %s)", self.restarts, _found(live)
        )

    def _watch_server(self, server_pid: int) -> None:
        self._watch_pid(
            "tmux", server_pid, lambda: self._spawn(self._on_tmux_exit(server_pid), "heal")
        )
