"""Keeps the AI CLI running in the tmux pane: launch, exit, the restart policy's backoff, healing
a tmux server that died, and stopping the CLI's whole tree.

The CLI's record (`CliStatus`: its status and all a crash needs of it) changes only through
`ProcessState.change` and its kin, whose `on_change` saves the state file, tells the agent
machine and publishes the event; every launch and every exit handler runs under one lock, and
a generation number makes stale exit notices harmless. A launch that tmux cannot carry out (its
server died or exited while starting) is retried in a fresh server after a backoff, so no fault
leaves the sleeve without a CLI for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from sidecar.agent.awareness import Awareness
from sidecar.agent.registry import CLIDef
from sidecar.config import Config
from sidecar.core import proc
from sidecar.core.event_shapes import CliExit, ErrorEvent
from sidecar.core.events import EventBus
from sidecar.core.states import ProcessState, ProcState
from sidecar.pane.tmux import PaneInfo, Tmux, TmuxError, fatal_pane_argv
from sidecar.process import pane_procs, persist, proctree
from sidecar.process.cli_status import CliStatus
from sidecar.process.deaths import REAPED, of_shell_code
from sidecar.process.launch_plan import LaunchPlanner
from sidecar.process.persist import ProcRef
from sidecar.process.pidfd import PidWatches, wait_exited
from sidecar.process.restart import PendingStart, Spawn, restarts
from sidecar.process.stats import SupervisorStats
from sidecar.process.tmux_server import TmuxServer
from sidecar.security.acting import Owner

log = logging.getLogger(__name__)

# Seconds before a tmux control client that went away by itself is attached again: a client
# tmux keeps letting go of (a `detach-client` in a loop) is tried at that pace, no faster.
REATTACH_AFTER = 0.5
# Seconds a tmux server that could not tell a pane's exit status gets to show it is dying: the
# pane's end and the server's exit come a moment apart when the server is killed.
SERVER_EXIT_WITHIN = 0.5


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
        self.plans = LaunchPlanner(registry, awareness, env, owner, config.workspace)
        self.server = TmuxServer(tmux, awareness.activity.paused)
        awareness.activity.on_detach = self._detached
        self.process = ProcessState(self._changed, initial=CliStatus(cli=config.cli))
        self.lock = asyncio.Lock()  # launches, heals, resleeves and shutdown, one at a time
        self.stopping = False
        self.gen = 0  # bumped on every launch; stale exit notices compare against it
        # A pane process a dead supervisor recorded, whose tmux server is gone: its CLI may
        # live on (one that ignores SIGHUP), and shutdown stops it.
        self.orphan: ProcRef | None = None
        self._pending = PendingStart(spawn)
        self._watches = PidWatches()

    @property
    def status(self) -> CliStatus:
        return self.process.status

    @property
    def name(self) -> str:
        return self.status.cli

    def is_guard(self, pid: int) -> bool:
        """Whether `pid` is the process the pane runs the CLI through (with an allowlist, the
        egress guard's broker): the CLI's recorded pid, or, while that is not known yet, the
        pane's waiter's child."""
        if self.status.pid is not None:
            return pid == self.status.pid
        pane = self.server.pane
        return pane is not None and proc.ppid(pid) == pane.pane_pid

    def _changed(self, old: CliStatus, new: CliStatus, restored: bool) -> None:
        """Every change of the CLI's record: the agent machine hears of it, its event goes out
        (not again for one taken over after a crash), and the state file records it."""
        self.awareness.process_changed(
            new.state, self.registry.get(new.cli), why=new.why_not_running
        )
        if not restored and new.state is ProcState.EXITED:
            self.bus.publish(CliExit(cli=new.cli, exit_code=new.exit_code, pid=new.pid))
        elif not restored and new.state is ProcState.FATAL and new.reason:
            self.bus.publish(ErrorEvent(message=new.reason, cli=new.cli))
        self._save()

    def _here(self, status: CliStatus) -> CliStatus:
        """`status` naming our tmux server and pane as they are now."""
        return replace(status, tmux=self.server.ref, pane=self.server.pane_ref)

    # ---- launching -----------------------------------------------------------------------

    async def launch(
        self,
        *,
        resume: bool,
        fresh_server: bool | None = None,
        cli: str | None = None,
        failures: int | None = None,
    ) -> None:
        """Start a CLI in the pane (caller holds `lock`): `cli` (default: the current one),
        whose backoff has counted `failures` (default: as the record says). `fresh_server`: a
        new tmux server (True), the live one's pane (False), or whichever the server's identity
        calls for (None)."""
        if self.stopping:
            return
        fresh = not self.server.alive() if fresh_server is None else fresh_server
        name = self.name if cli is None else cli
        plan = self.plans.plan(name, resume=resume)
        argv, env, fatal, export = plan.argv, plan.env, plan.fatal, plan.export
        if fatal is not None:
            # The session must exist for the terminal; its pane says what is wrong.
            argv, env, export = fatal_pane_argv(fatal), {}, True
        self.gen += 1
        gen = self.gen
        self._pending.cancel()
        if fresh:
            self.server.ref = None  # the record names no server until the new one runs
        starting = CliStatus(
            ProcState.STARTING,
            failures=self.status.failures if failures is None else failures,
            cli=name,
            command=plan.command,
            argv=argv,
            resume=resume,
            pane_command=persist.digest(self.server.tmux.pane_argv(argv, env, export=export)),
        )
        # -> STARTING, saved before tmux is asked: a supervisor taking over after a crash
        # from here on tells by the pane's argv whether this launch happened.
        self.process.change(self._here(starting))
        try:
            pane = await self.server.launch(
                argv, self.config.workspace, env, fresh=fresh, export=export
            )
        except (TmuxError, OSError) as exc:
            self._tmux_failed(exc, resume=resume, gen=gen)
            return
        self._watch_server(pane.server_pid)
        if fatal is not None:
            # STARTING -> FATAL: the placeholder pane exits at once; nothing restarts it.
            log.error("CLI %s cannot start: %s", name, fatal)
            self.process.change(
                self._here(replace(self.status, state=ProcState.FATAL, reason=fatal))
            )
            return
        pid = await pane_procs.cli_pid(pane.pane_pid)
        # STARTING -> RUNNING: the pane's waiter has started the CLI.
        running = replace(
            self.status,
            state=ProcState.RUNNING,
            pid=pid,
            started_at=time.monotonic(),
            process=ProcRef.of(pid),
        )
        self.process.change(self._here(running))
        log.info("CLI %s running as pid %s: %s", name, pid, list(argv))
        self._watch_cli(pane, gen)

    def _tmux_failed(self, exc: BaseException, *, resume: bool, gen: int) -> None:
        """tmux could not make the session or run the pane (its server died while starting,
        or exited on its own): STARTING -> BACKOFF, then a fresh server. Whatever the restart
        policy: it is about the CLI ending, and this CLI never ran."""
        self._watches.unwatch("tmux")
        self.bus.publish(ErrorEvent(message=f"tmux failed: {exc}"))
        delay = self.process.back_off(self._here(self.status), f"tmux failed: {exc}")
        log.error("cannot start the CLI in tmux: %s; retrying in %gs", exc, delay)
        self._pending.schedule(delay, lambda: self._start_again(gen, resume, counted=False))

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

    def _detached(self) -> None:
        """The control client went away by itself: attached again while our pane's server
        runs (`detach-client` typed in the terminal must not leave /screen answering 503 and
        the pane's activity unseen until the next launch). A server that died is healed, and
        the heal's launch attaches it."""
        self._spawn(self._attach_again(), "reattach")

    async def _attach_again(self) -> None:
        await asyncio.sleep(REATTACH_AFTER)  # sleep-ok: the pace of attaching again
        async with self.lock:  # never while a launch or a heal makes a server
            if not self.stopping and self.server.alive():
                log.info("the tmux control client went away; attaching it again")
                self.awareness.activity.attach()

    # ---- exits and the restart policy ----------------------------------------------------

    async def on_exit(self, gen: int) -> None:
        """The CLI ended by itself: EXITED, and BACKOFF if the restart policy says so."""
        if gen != self.gen or self.stopping or self.status.state is not ProcState.RUNNING:
            return  # a resleeve, a heal or shutdown stopped it on purpose
        code = await pane_procs.exit_code(self.server.tmux)
        # A pane that ended with its tmux server (a SIGKILL closes the server's ptys before the
        # kernel reports its exit, so this notice can come first) is no exit of the CLI: the
        # server's watch heals it and says how the server died.
        server_died = code is None and await self._server_died()
        if gen != self.gen or self.status.state is not ProcState.RUNNING or server_died:
            return
        ran = time.monotonic() - (self.status.started_at or time.monotonic())
        log.warning(
            "CLI %s exited with %s%s after %.1fs", self.name, code, of_shell_code(code), ran
        )
        self.stats.cli_exited(code)
        # RUNNING -> EXITED: the CLI ended by itself.
        exited = replace(self.status, state=ProcState.EXITED, exit_code=code, process=None)
        self.process.change(self._here(exited))
        if restarts(self.config.restart, code):
            # EXITED -> BACKOFF: wait, then start it again with its resume argv.
            delay = self.process.back_off(self.status)
            self._pending.schedule(delay, lambda: self._start_again(gen, resume=True))

    async def _server_died(self) -> bool:
        """Whether our pane's tmux server has exited, or does within a moment (no server
        known: not that we know of)."""
        ref = self.server.ref
        if ref is None:
            return False
        return not ref.alive() or not await wait_exited([ref.pid], SERVER_EXIT_WITHIN)

    async def _start_again(self, gen: int, resume: bool, *, counted: bool = True) -> None:
        """Launch again unless something else launched meanwhile; `counted`: a start by the
        restart policy, not a retry of a launch tmux failed."""
        async with self.lock:
            if gen == self.gen and not self.stopping:
                if counted:
                    self.stats.cli_restarts += 1
                # What the ended CLI left in its pane's session (a child that ignores SIGHUP,
                # which respawn-pane does not stop) goes first: never two CLIs at once.
                await self.stop_pane_tree()
                await self.launch(resume=resume)

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

    async def stop_tree(self, root: int, root_started: float | None) -> None:
        """The whole tree (and session) of `root`, within the stop grace (`proctree`)."""
        grace = self.config.stop_grace
        stopped = await asyncio.to_thread(proctree.stop_tree, root, root_started, grace)
        if stopped.killed:
            log.warning("SIGKILL to %d processes that outlived %.1fs", stopped.killed, grace)
        if stopped.stuck:
            log.error("processes did not die on SIGKILL: %s", list(stopped.stuck))

    async def stop_pane_tree(self) -> None:
        """The CLI's whole tree: SIGTERM/SIGHUP, SIGKILL what is left after the grace."""
        pane = self.server.pane
        if pane is not None:
            await self.stop_tree(pane.pane_pid, self.server.pane_started)
        if self.orphan is not None:
            await self.stop_tree(self.orphan.pid, self.orphan.start)
            self.orphan = None

    async def switch(self, name: str) -> None:
        """Stop the CLI's tree and start `name` (caller holds `lock`): a resleeve's work."""
        self._pending.cancel()
        self._stopping_state()
        self._watches.unwatch("cli")
        await self.stop_pane_tree()
        # Another CLI starts with its command: its resume argv would look for a conversation
        # of its own that this workspace never had. Its backoff starts anew.
        await self.launch(resume=name == self.name, cli=name, failures=0)

    async def stop(self) -> None:
        """Shutdown's part: the CLI's tree, within the grace (caller holds `lock`)."""
        self._pending.cancel()
        self._watches.unwatch("cli")
        if self.server.pane is not None or self.orphan is not None:
            self._stopping_state()
            await self.stop_pane_tree()

    def stopped(self) -> None:
        self._stopping_state()
        # STOPPING -> STOPPED: nothing of the CLI runs any more.
        self.process.change(self._here(replace(self.status, state=ProcState.STOPPED)))

    def _stopping_state(self) -> None:
        if self.status.state is not ProcState.STOPPING:
            # -> STOPPING: exits from here on are ours.
            self.process.change(self._here(replace(self.status, state=ProcState.STOPPING)))

    # ---- taking over after a crash (the plans of `sidecar.process.takeover`) -----------------

    def take(self, live: PaneInfo, recorded: ProcRef | None) -> None:
        """Make `live` our pane and watch its tmux server."""
        self.server.take(live, recorded)
        self._watch_server(live.server_pid)

    def adopt(self, status: CliStatus, live: PaneInfo) -> None:
        """Take over the pane and the CLI in it as they are (`status`: the record a dead
        supervisor saved, as the take-over found it): the CLI never notices."""
        self.take(live, status.pane)
        self.gen += 1
        self.process.restore(self._here(status))
        if status.state is ProcState.RUNNING and live.dead:
            # The CLI ended while no supervisor was watching: its exit is handled now (not by
            # a pidfd: the dead pane's pid may belong to another process by now).
            self._spawn(self.on_exit(self.gen), "cli-exit")
        elif status.state is ProcState.RUNNING:
            self._watch_cli(live, self.gen)
        elif status.state is ProcState.BACKOFF:
            # A restart a dead supervisor had scheduled comes when it was due.
            due = status.restart_due or time.monotonic()
            gen = self.gen
            delay = max(0.0, due - time.monotonic())
            self._pending.schedule(delay, lambda: self._start_again(gen, resume=True))

    def stop_only(self, live: PaneInfo | None, record: persist.SupervisorState | None) -> None:
        """Shut down at once: take what runs (the pane on our socket, else the recorded one,
        whose CLI may outlive a dead tmux server) for `stop` to stop; start nothing."""
        if live is not None:
            self.take(live, record.pane if record is not None else None)
        elif record is not None and record.pane is not None:
            self.orphan = record.pane
        name = record.cli if record is not None else self.name
        # STOPPED -> STOPPING: a shutdown is all that is left to do.
        self.process.change(self._here(CliStatus(ProcState.STOPPING, cli=name)))
