"""Keeps the AI CLI running in the tmux pane: launch, exit, the restart policy with backoff,
healing a tmux server that died, and stopping the CLI's whole tree.

The CLI's status changes only through `ProcessState.change` (its `on_change` saves the state
file, tells the agent machine and publishes the event); every launch and every exit handler
runs under one lock, and a generation number makes stale exit notices harmless. A launch that
tmux cannot carry out (its server died or exited while starting) is retried in a fresh server
after a backoff, so no fault leaves the sleeve without a CLI for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import psutil

from sidecar.agent.awareness import Awareness
from sidecar.agent.registry import CLIDef
from sidecar.config import Config, RestartPolicy
from sidecar.core.event_shapes import CliExit, ErrorEvent
from sidecar.core.events import EventBus
from sidecar.core.states import (
    BACKOFF_RESET_AFTER,
    ProcessState,
    ProcState,
    ProcStatus,
    backoff_delay,
)
from sidecar.pane.tmux import PaneInfo, Tmux, TmuxError, fatal_pane_argv
from sidecar.process import persist
from sidecar.process.deaths import REAPED, of_shell_code
from sidecar.process.persist import ProcRef
from sidecar.process.pidfd import PidWatches
from sidecar.process.proctree import stop_tree
from sidecar.process.stats import SupervisorStats
from sidecar.process.tmux_server import TmuxServer
from sidecar.security.acting import Owner, acting, which

log = logging.getLogger(__name__)

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class LaunchPlan(NamedTuple):
    """One start of the CLI: the registry's argv it starts from (`command`), the argv the pane
    runs (our hook settings, session arguments and the egress guard added) and the variables it
    gets, or why it cannot start (`fatal`)."""

    command: tuple[str, ...]
    argv: tuple[str, ...]
    env: dict[str, str]
    fatal: str | None


class CliRunner:
    """`save` writes the state file (the supervisor's: it holds more than the CLI); `spawn`
    runs a task whose failure crashes the supervisor (crash-only)."""

    def __init__(
        self,
        config: Config,
        registry: Mapping[str, CLIDef],
        bus: EventBus,
        *,
        tmux: Tmux,
        awareness: Awareness,
        stats: SupervisorStats,
        env: Mapping[str, str],
        owner: Owner | None,
        spawn: Spawn,
        save: Callable[[], None],
    ) -> None:
        self.config = config
        self.registry = registry
        self.bus = bus
        self.awareness = awareness
        self.stats = stats
        self._spawn = spawn
        self._save = save
        self.name = config.cli
        self.env = env  # the CLI's environment (its user's HOME with SIDECAR_USER)
        self.egress_env: Mapping[str, str] = {}  # the egress proxy's variables: they win
        # Wraps the CLI's argv in the egress enforcement (the argv itself: an open network).
        self.egress_guard: Callable[[tuple[str, ...]], tuple[str, ...]] = lambda argv: argv
        self.owner = owner  # how the sidecar acts in the workspace (sidecar.security.acting)
        self.server = TmuxServer(tmux)
        self.process = ProcessState(self._changed)
        self.lock = asyncio.Lock()  # launches, heals, resleeves and shutdown, one at a time
        self.stopping = False
        self.gen = 0  # bumped on every launch; stale exit notices compare against it
        self.backoff_n = 0  # the restart policy's failures in a row
        self.restart_due: float | None = None  # time.monotonic() of the backoff's restart
        self.command: tuple[str, ...] = ()  # the registry's argv the launch started from
        self.argv: tuple[str, ...] = ()  # what the pane runs: `command` with what we add
        self.resume = False
        self.pane_command = ""  # digest of the pane's argv: names the launch in the record
        self.cli_ref: ProcRef | None = None
        # A pane process a dead supervisor recorded, whose tmux server is gone: its CLI may
        # live on (one that ignores SIGHUP), and shutdown stops it.
        self.orphan: ProcRef | None = None
        self._tmux_failures = 0  # launches tmux could not carry out, in a row
        self._backoff_task: asyncio.Task[None] | None = None
        self._watches = PidWatches()

    @property
    def status(self) -> ProcStatus:
        return self.process.status

    def _changed(self, old: ProcStatus, new: ProcStatus, restored: bool) -> None:
        """Every change of the CLI's status: the agent machine hears of it, its event goes
        out (not again for one taken over after a crash), and the state file records it."""
        self.awareness.process_changed(
            new.state, self.registry.get(self.name), why=new.why_not_running
        )
        if not restored and new.state is ProcState.EXITED:
            self.bus.publish(CliExit(cli=self.name, exit_code=new.exit_code, pid=new.pid))
        elif not restored and new.state is ProcState.FATAL and new.reason:
            self.bus.publish(ErrorEvent(message=new.reason, cli=self.name))
        self._save()

    # ---- launching -----------------------------------------------------------------------

    def _plan(self, *, resume: bool) -> LaunchPlan:
        """What the current CLI's start runs, or the reason it cannot start."""
        cli = self.registry.get(self.name)
        if cli is None:
            known = ", ".join(sorted(self.registry))
            fatal = (
                f"unknown CLI {self.name!r} (SLEEVE_CLI); known: {known}. "
                'POST /resleeve {"cli": NAME} starts one'
            )
            return LaunchPlan((), (), {}, fatal)
        with acting(self.owner):  # the history is the CLI user's, maybe private to it
            history = cli.has_history(self.env, self.config.workspace)
        command = cli.argv(resume=resume, has_history=history)
        # Not as the CLI's user: the launch keeps the hook secret in the sidecar's own state
        # file (each CLI's own files are made as the user who reads them, where they are made).
        argv, added = self.awareness.launch_argv(cli, command, self.env, has_history=history)
        env = {**cli.env, **added, **self.egress_env}
        path = {**self.env, **env}.get("PATH", os.defpath)
        if which(argv[0], path, self.owner) is None:
            fatal = f"{argv[0]!r} not found on PATH ({path}); the {cli.name} CLI is not installed"
            return LaunchPlan(command, argv, env, fatal)
        return LaunchPlan(command, self.egress_guard(argv), env, None)

    async def launch(self, *, resume: bool, fresh_server: bool | None = None) -> None:
        """Start the current CLI in the pane (caller holds `lock`). `fresh_server`: a new tmux
        server (True), the live one's pane (False), or whichever the server's identity calls
        for (None)."""
        if self.stopping:
            return
        fresh = not self.server.alive() if fresh_server is None else fresh_server
        plan = self._plan(resume=resume)
        argv, env, fatal = plan.argv, plan.env, plan.fatal
        if fatal is not None:
            # The session must exist for the terminal; its pane says what is wrong.
            argv, env = fatal_pane_argv(fatal), {}
        self.gen += 1
        gen = self.gen
        self._cancel_backoff()
        self.command, self.argv, self.resume = plan.command, argv, resume
        self.pane_command = persist.digest(self.server.tmux.pane_argv(argv, env))
        self.cli_ref, self.restart_due = None, None
        if fresh:
            self.server.ref = None  # the record names no server until the new one runs
        # -> STARTING, saved before tmux is asked: a supervisor taking over after a crash
        # from here on tells by the pane's argv whether this launch happened.
        self.process.change(ProcStatus(ProcState.STARTING))
        try:
            pane = await self.server.launch(argv, self.config.workspace, env, fresh=fresh)
        except (TmuxError, OSError) as exc:
            self._tmux_failed(exc, resume=resume, gen=gen)
            return
        self._tmux_failures = 0
        self._watch_server(pane.server_pid)
        if fatal is not None:
            # STARTING -> FATAL: the placeholder pane exits at once; nothing restarts it.
            log.error("CLI %s cannot start: %s", self.name, fatal)
            self.process.change(ProcStatus(ProcState.FATAL, reason=fatal))
            return
        pid = await self._cli_pid(pane.pane_pid)
        self.cli_ref = ProcRef.of(pid)
        # STARTING -> RUNNING: the pane's waiter has started the CLI.
        self.process.change(ProcStatus(ProcState.RUNNING, pid=pid, started_at=time.monotonic()))
        log.info("CLI %s running as pid %s: %s", self.name, pid, list(argv))
        self._watch_cli(pane, gen)

    def _tmux_failed(self, exc: BaseException, *, resume: bool, gen: int) -> None:
        """tmux could not make the session or run the pane (its server died while starting,
        or exited on its own): STARTING -> BACKOFF, then a fresh server. Whatever the restart
        policy: it is about the CLI ending, and this CLI never ran."""
        self._watches.unwatch("tmux")
        self._tmux_failures += 1
        delay = backoff_delay(self._tmux_failures)
        reason = f"tmux failed: {exc}; retrying in {delay:g}s"
        log.error("cannot start the CLI in tmux: %s; retrying in %gs", exc, delay)
        self.bus.publish(ErrorEvent(message=f"tmux failed: {exc}"))
        self.restart_due = time.monotonic() + delay
        self.process.change(ProcStatus(ProcState.BACKOFF, reason=reason))
        retry = self._restart_after(delay, gen, resume, restart=False)
        self._backoff_task = self._spawn(retry, "backoff")

    async def _cli_pid(self, waiter: int) -> int | None:
        """The CLI's pid: the pane waiter's child that runs another program (the waiter forks
        short-lived copies of itself while it reads the CLI's environment; None if gone)."""
        deadline = time.monotonic() + 10.0  # the waiter reads a line of env per fork
        while True:
            try:
                parent = psutil.Process(waiter)
                own = parent.cmdline()
                children = parent.children()
            except psutil.NoSuchProcess:
                return None
            for child in children:
                with contextlib.suppress(psutil.Error):
                    if child.cmdline() != own:
                        return child.pid
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.005)

    def _watch_cli(self, pane: PaneInfo, gen: int) -> None:
        """Handle the CLI's exit when the pane's process ends (at once if it has already)."""
        self._watches.watch(
            "cli", pane.pane_pid, lambda: self._spawn(self.on_exit(gen), "cli-exit")
        )

    def _watch_server(self, server_pid: int) -> None:
        self._watches.watch(
            "tmux", server_pid, lambda: self._spawn(self._on_tmux_exit(server_pid), "heal")
        )

    def unwatch(self) -> None:
        self._watches.unwatch("cli")
        self._watches.unwatch("tmux")

    # ---- exits and the restart policy ----------------------------------------------------

    async def on_exit(self, gen: int) -> None:
        """The CLI ended by itself: EXITED, and BACKOFF if the restart policy says so."""
        if gen != self.gen or self.stopping or self.status.state is not ProcState.RUNNING:
            return  # a resleeve, a heal or shutdown stopped it on purpose
        code = await self._dead_status()
        if gen != self.gen or self.status.state is not ProcState.RUNNING:
            return
        ran = time.monotonic() - (self.status.started_at or time.monotonic())
        log.warning(
            "CLI %s exited with %s%s after %.1fs", self.name, code, of_shell_code(code), ran
        )
        self.stats.cli_exited(code)
        self.cli_ref = None
        # RUNNING -> EXITED: the CLI ended by itself.
        self.process.change(replace(self.status, state=ProcState.EXITED, exit_code=code))
        policy = self.config.restart
        if policy is RestartPolicy.ALWAYS or (policy is RestartPolicy.ON_FAILURE and code != 0):
            if ran >= BACKOFF_RESET_AFTER:
                self.backoff_n = 0
            self.backoff_n += 1
            delay = backoff_delay(self.backoff_n)
            self.restart_due = time.monotonic() + delay
            # EXITED -> BACKOFF: wait, then start it again with its resume argv.
            self.process.change(
                replace(self.status, state=ProcState.BACKOFF, reason=f"restarting in {delay:g}s")
            )
            self._backoff_task = self._spawn(self._restart_after(delay, gen, True), "backoff")

    async def _dead_status(self) -> int | None:
        """The CLI's exit code: its waiter wrote it before exiting. If the waiter itself was
        killed, ask tmux (briefly: it records a status only when it has reaped the pane)."""
        tmux = self.server.tmux
        code = tmux.exit_status()
        if code is not None:
            return code
        deadline = time.monotonic() + 0.5
        while True:
            try:
                info = await asyncio.to_thread(tmux.pane_info)
            except (TmuxError, OSError):
                return None  # tmux itself is gone; its own watcher heals it
            # tmux marks the pane dead when the pty closes, and records the status when it
            # reaps the child: the two can come in either order.
            if (info.dead and info.dead_status is not None) or time.monotonic() > deadline:
                return info.dead_status
            await asyncio.sleep(0.01)

    async def _restart_after(
        self, delay: float, gen: int, resume: bool, *, restart: bool = True
    ) -> None:
        """Launch again after `delay` unless something else launched meanwhile; `restart`: it
        is the restart policy's (counted), not a retry of a launch tmux failed."""
        await asyncio.sleep(delay)
        async with self.lock:
            if gen == self.gen and not self.stopping:
                if restart:
                    self.stats.cli_restarts += 1
                await self.launch(resume=resume)

    def schedule_restart(self, due: float | None) -> None:
        """A restart in backoff that a dead supervisor had scheduled, due at `due`."""
        self.restart_due = due = due or time.monotonic()
        delay = max(0.0, due - time.monotonic())
        self._backoff_task = self._spawn(self._restart_after(delay, self.gen, True), "backoff")

    def _cancel_backoff(self) -> None:
        if self._backoff_task is not None and self._backoff_task is not asyncio.current_task():
            self._backoff_task.cancel()
        self._backoff_task = None

    async def _on_tmux_exit(self, server_pid: int) -> None:
        if self.stopping:
            return
        async with self.lock:
            pane = self.server.pane
            if self.stopping or pane is None or pane.server_pid != server_pid:
                return
            ref = self.server.ref
            start = ref.start if ref is not None and ref.pid == server_pid else None
            death = await REAPED.death_of(server_pid, start)
            self.stats.tmux_deaths[death.label] += 1
            how = f"tmux server {server_pid} {death.describe()}"
            log.error("%s; recreating the session", how)
            self.bus.publish(ErrorEvent(message=f"{how}; session recreated"))
            # Its pane's CLI got SIGHUP, but one that ignores it lives on as an orphan.
            await self.stop_pane_tree()
            self.stats.tmux_heals += 1
            await self.launch(resume=True, fresh_server=True)

    # ---- stopping ------------------------------------------------------------------------

    async def stop_pane_tree(self) -> None:
        """The CLI's whole tree: SIGTERM/SIGHUP, SIGKILL what is left after the grace."""
        pane = self.server.pane
        if pane is not None:
            await stop_tree(pane.pane_pid, self.server.pane_started, self.config.stop_grace)
        if self.orphan is not None:
            await stop_tree(self.orphan.pid, self.orphan.start, self.config.stop_grace)
            self.orphan = None

    async def switch(self, name: str) -> None:
        """Stop the CLI's tree and start `name` (caller holds `lock`): a resleeve's work."""
        self._cancel_backoff()
        self._stopping_state()
        self._watches.unwatch("cli")
        await self.stop_pane_tree()
        previous, self.name = self.name, name
        self.backoff_n = 0
        # Another CLI starts with its command: its resume argv would look for a conversation
        # of its own that this workspace never had.
        await self.launch(resume=name == previous)

    async def stop(self) -> None:
        """Shutdown's part: the CLI's tree, within the grace (caller holds `lock`)."""
        self._cancel_backoff()
        self._watches.unwatch("cli")
        if self.server.pane is not None or self.orphan is not None:
            self._stopping_state()
            await self.stop_pane_tree()

    def stopped(self) -> None:
        self._stopping_state()
        # STOPPING -> STOPPED: nothing of the CLI runs any more.
        self.process.change(replace(self.status, state=ProcState.STOPPED))

    def _stopping_state(self) -> None:
        if self.status.state is not ProcState.STOPPING:
            # -> STOPPING: exits from here on are ours.
            self.process.change(replace(self.status, state=ProcState.STOPPING))

    # ---- taking over after a crash (the plans of `sidecar.process.adopt`) ------------------------

    def take(self, live: PaneInfo, recorded: ProcRef | None) -> None:
        """Make `live` our pane and watch its tmux server."""
        self.server.take(live, recorded)
        self._watch_server(live.server_pid)

    async def adopt(self, record: persist.SupervisorState, live: PaneInfo) -> None:
        """Take over the pane and the CLI in it as they are: the CLI never notices."""
        self.take(live, record.pane)
        self.name = record.cli
        self.command, self.argv, self.resume = record.command, record.argv, record.resume
        self.pane_command = record.pane_command
        self.backoff_n = record.backoff_n
        self.gen += 1
        state = ProcState(record.cli_state)
        if state is ProcState.STARTING:
            # The launch went through but was not recorded: the CLI has just started.
            state = ProcState.RUNNING
            pid = await self._cli_pid(live.pane_pid)
            self.cli_ref = ProcRef.of(pid)
            self.process.restore(ProcStatus(state, pid=pid, started_at=time.monotonic()))
        elif state in (ProcState.RUNNING, ProcState.STOPPING):
            if state is ProcState.STOPPING and record.resleeve_to is None:
                state = ProcState.RUNNING  # only a resleeve leaves that state saved
            self.cli_ref = record.cli_pid
            pid = record.cli_pid.pid if record.cli_pid else None
            self.process.restore(ProcStatus(state, pid=pid, started_at=record.started_at))
        else:
            # EXITED/BACKOFF/FATAL: the pane shows why; a pending restart comes when it was due.
            self.process.restore(
                ProcStatus(state, exit_code=record.exit_code, reason=record.reason)
            )
        if state is ProcState.RUNNING and live.dead:
            # The CLI ended while no supervisor was watching: its exit is handled now (not by
            # a pidfd: the dead pane's pid may belong to another process by now).
            self._spawn(self.on_exit(self.gen), "cli-exit")
        elif state is ProcState.RUNNING:
            self._watch_cli(live, self.gen)
        elif state is ProcState.BACKOFF:
            self.schedule_restart(record.restart_due)

    def stop_only(self, live: PaneInfo | None, record: persist.SupervisorState | None) -> None:
        """Shut down at once: take what runs (the pane on our socket, else the recorded one,
        whose CLI may outlive a dead tmux server) for `stop` to stop; start nothing."""
        if live is not None:
            self.take(live, record.pane if record is not None else None)
        elif record is not None and record.pane is not None:
            self.orphan = record.pane
        if record is not None:
            self.name = record.cli
        # STOPPED -> STOPPING: a shutdown is all that is left to do.
        self.process.change(ProcStatus(ProcState.STOPPING))
