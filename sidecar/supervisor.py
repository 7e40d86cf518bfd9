"""Owns the processes: the tmux session with the AI CLI in it, and ttyd attached to it.

Start and stop order, the restart policy with backoff, self-healing when tmux dies, and the
soft resleeve (stop the CLI's whole tree, start the next CLI in the same pane). Process exits
are noticed through pidfds on the event loop, never by polling tmux. Every change of state is
saved to a file (`sidecar.persist`), so that a supervisor started again after a crash adopts
the running session and CLI (`take_over`) instead of starting them anew.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from typing import Any

import psutil

from sidecar import claude_code, cstack_files, persist, privs
from sidecar.adopt import Adopting
from sidecar.awareness import Awareness
from sidecar.clis import CLIDef
from sidecar.config import Config, RestartPolicy
from sidecar.contract import utc_now
from sidecar.events import EventBus
from sidecar.persist import ProcRef
from sidecar.proc import start_time
from sidecar.proctree import stop_tree, wait_exited
from sidecar.shapes import CliExit, ErrorEvent, Resleeve
from sidecar.states import BACKOFF_RESET_AFTER, ProcState, ProcStatus, backoff_delay
from sidecar.stats import SupervisorStats
from sidecar.tmux import (
    SESSION,
    PaneInfo,
    Tmux,
    TmuxError,
    fatal_pane_argv,
    recreate_socket,
)
from sidecar.ttyd_runner import TtydRunner, stop_stale
from sidecar.watch import CurrentWatcher

log = logging.getLogger(__name__)

TICK = 1.0  # the only periodic work: one stat of CURRENT.md and of the tmux socket
SECRET_VARS = ("SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN")


class ResleeveBusy(Exception):
    """A resleeve is already in progress."""


class UnknownCLI(Exception):
    """The requested CLI is not in the registry."""


class Supervisor(Adopting):
    def __init__(
        self,
        config: Config,
        registry: Mapping[str, CLIDef],
        bus: EventBus,
        *,
        restarts: int = 0,
        started: float | None = None,
    ) -> None:
        self.config = config
        self.registry = dict(registry)
        self.bus = bus
        self.cli_name = config.cli
        # With SIDECAR_USER: the CLI's environment (its HOME), and how the sidecar acts in the
        # workspace (as that user; see sidecar.privs). Without it: the sidecar's own.
        self.cli_env = privs.user_env(config.child_env, config.user, config.cli_home)
        user_env = self.cli_env if config.user is not None else None
        self.owner = privs.workspace_owner(config.user, config.workspace, os.geteuid())
        self.ttyd = TtydRunner(
            port=config.ttyd_port,
            socket_path=config.ttyd_socket,
            tmux_socket=config.tmux_socket,
            session=SESSION,
            state_dir=config.state_dir,
            path_env=config.child_env.get("PATH"),
            bus=bus,
            on_change=self._save,
            run_as=config.user,
            env=user_env,
        )
        # The sidecar's start (init's), not this supervisor's: /health's uptime survives a crash.
        self.started = time.monotonic() if started is None else started
        self.restarts = restarts  # supervisors that ran before this one (crashed)
        self.restarted_at = utc_now() if restarts else None
        # Set when a task of ours failed: `main` then ends this supervisor without stopping
        # anything, and init starts a new one that adopts what runs (crash-only).
        self.crashed = asyncio.Event()
        self.warnings: list[str] = []
        self.stats = SupervisorStats()
        self.current = CurrentWatcher(
            config.workspace / ".cstack" / "CURRENT.md", bus, config.workspace, self.owner
        )
        self.tmux = Tmux(
            config.tmux_socket,
            config.state_dir / "tmux.conf",
            config.session_dir / "cli.status",
            run_as=config.user,
            env=user_env,
        )
        # What the agent is doing (sidecar.agent): told of every change of the CLI's state.
        self.awareness = Awareness(config, bus, self.tmux)
        self.cli = ProcStatus()
        self.pane: PaneInfo | None = None
        self._pane_started: float | None = None  # the pane process's start time (pid reuse)
        self.resleeving = False
        self._resleeve_move: tuple[str, str] | None = None  # (from, to) while one is under way
        self._stopping = False
        self._gen = 0  # bumped on every CLI launch; stale exit notices compare against it
        self._backoff_n = 0
        self._restart_due: float | None = None  # time.monotonic() of the backoff's restart
        # What the state file says besides the above (see `SupervisorState`).
        self.state_file = config.state_dir / persist.STATE_FILE
        self._init = ProcRef.of(os.getppid())
        self._saved = b""
        self._argv: tuple[str, ...] = ()
        self._resume = False
        self._pane_command = ""
        self._server: ProcRef | None = None
        self._cli_ref: ProcRef | None = None
        # A pane process a dead supervisor recorded, whose tmux server is gone: its CLI may
        # live on (one that ignores SIGHUP), and shutdown stops it.
        self._orphan: ProcRef | None = None
        self._cli_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._backoff_task: asyncio.Task[None] | None = None
        self._pidfds: dict[str, int] = {}

    @property
    def cli(self) -> ProcStatus:
        return self._cli

    @cli.setter
    def cli(self, value: ProcStatus) -> None:
        self._cli = value
        self.awareness.process_changed(value.state, self.registry.get(self.cli_name))

    # ---- helpers -------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.critical("task %s failed", task.get_name(), exc_info=task.exception())
            self.bus.publish(ErrorEvent(message=f"internal task {task.get_name()} failed"))
            # A failed task leaves state nobody can trust: crash, be started again, adopt.
            if not self._stopping:
                self.crashed.set()

    def _watch_pid(self, key: str, pid: int, callback: Callable[[], object]) -> None:
        """Call `callback()` on the loop when `pid` exits (pidfd readable)."""
        loop = asyncio.get_running_loop()
        self._unwatch(key)
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(callback)
            return
        self._pidfds[key] = fd

        def fire() -> None:
            self._unwatch(key)
            callback()

        loop.add_reader(fd, fire)

    def _unwatch(self, key: str) -> None:
        fd = self._pidfds.pop(key, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def _plan_launch(self, *, resume: bool) -> tuple[tuple[str, ...], dict[str, str], str | None]:
        """argv and pane env of the current CLI, or the reason it cannot start."""
        cli = self.registry.get(self.cli_name)
        if cli is None:
            known = ", ".join(sorted(self.registry))
            fatal = (
                f"unknown CLI {self.cli_name!r} (SLEEVE_CLI); known: {known}. "
                'POST /resleeve {"cli": NAME} starts one'
            )
            return (), {}, fatal
        argv = self._argv_for(cli, resume=resume)
        env = dict(cli.env)
        path = {**self.cli_env, **env}.get("PATH", os.defpath)
        if privs.which(argv[0], path, self.owner) is None:
            fatal = f"{argv[0]!r} not found on PATH ({path}); the {cli.name} CLI is not installed"
            return argv, env, fatal
        return argv, env, None

    def _argv_for(self, cli: CLIDef, *, resume: bool) -> tuple[str, ...]:
        env = self.cli_env
        with privs.acting(self.owner):  # the history is the CLI user's, maybe private to it
            history = claude_code.has_history(claude_code.config_dir(env), self.config.workspace)
            argv = cli.argv(resume=resume, has_history=history)
            return self.awareness.launch_argv(cli, argv, env, has_history=history)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self, *, stop_at_once: bool = False) -> bool:
        """Start tmux with the CLI, and ttyd beside it; after a crash, take over what runs.
        Returns whether to shut down at once: init asked (`stop_at_once`: a SIGTERM came while
        no supervisor was running, or the last one died after it), or the dead supervisor had
        begun a shutdown. Then nothing new is started. The state dir exists already (0700):
        `main` makes it before anything starts, so that an unusable one is a configuration
        error."""
        cfg = self.config
        for var in SECRET_VARS:
            # Children (tmux, the CLI, ttyd) must not inherit the API's tokens.
            os.environ.pop(var, None)
        record, found = persist.load(self.state_file)
        ours = record if record is not None and record.init == self._init else None
        if ours is not None and ours.ttyd is not None:
            await stop_stale(ours.ttyd, cfg.tmux_socket)
        if stop_at_once or (ours is not None and ours.stopping):
            await self._take_over_to_stop(ours)
            return True
        with privs.acting(self.owner):  # made by, and checked for, the CLI's user
            try:
                cfg.workspace.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                self.warnings.append(f"workspace {cfg.workspace} cannot be created: {exc.strerror}")
            if cfg.workspace.is_dir() and not os.access(
                cfg.workspace, os.W_OK, effective_ids=os.access in os.supports_effective_ids
            ):
                who = f" for SIDECAR_USER {cfg.user.spec}" if cfg.user else ""
                self.warnings.append(f"workspace {cfg.workspace} is read-only{who}")
        if cfg.goal and not self.restarts:  # a restart must not undo the agent's own edits
            try:
                await asyncio.to_thread(
                    cstack_files.write_goal, self.current.path, cfg.goal, cfg.workspace, self.owner
                )
            except OSError as exc:
                self.warnings.append(f"SLEEVE_GOAL not written to CURRENT.md: {exc.strerror}")
        if ours is not None:
            self.warnings += [w for w in ours.warnings if w not in self.warnings]
        self.current.get()
        self.awareness.start()
        # ttyd starts beside the CLI, not after it: it needs the tmux session only when a
        # browser attaches, and /terminal must be usable as soon as /health says healthy.
        self._spawn(self.ttyd.run(), "ttyd")
        async with self._cli_lock:
            if record is None and not self.restarts:
                await self._launch_cli(resume=False, fresh_server=True)  # a first start
            else:
                await self._take_over(record, found)
        self._spawn(self._tick(), "tick")
        return False

    async def _launch_cli(self, *, resume: bool, fresh_server: bool) -> None:
        """Start the current CLI in the pane (caller holds `_cli_lock`)."""
        if self._stopping:
            return
        argv, env, fatal = self._plan_launch(resume=resume)
        if fatal is not None:
            # The session must exist for the terminal; its pane says what is wrong.
            argv, env = fatal_pane_argv(fatal), {}
        self._gen += 1
        gen = self._gen
        # -> STARTING, saved before tmux is asked: a supervisor taking over after a crash
        # from here on tells by the pane's argv whether this launch happened.
        self.cli = ProcStatus(ProcState.STARTING)
        self._argv, self._resume = tuple(argv), resume
        self._pane_command = persist.digest(self.tmux.pane_argv(argv, env))
        self._cli_ref, self._restart_due = None, None
        if fresh_server:
            self._server = None
        self._save()
        try:
            if fresh_server:
                pane = await asyncio.to_thread(self.tmux.start, argv, self.config.workspace, env)
            else:
                pane = await asyncio.to_thread(self.tmux.respawn, argv, self.config.workspace, env)
        except (TmuxError, OSError) as exc:
            self.cli = ProcStatus(ProcState.FATAL, reason=f"tmux failed: {exc}")
            log.error("cannot start the CLI in tmux: %s", exc)
            self.bus.publish(ErrorEvent(message=self.cli.reason or "tmux failed"))
            self._save()
            return
        if fresh_server:
            self._take_pane(pane, None)
        else:
            self.pane, self._pane_started = pane, start_time(pane.pane_pid)
        if fatal is not None:
            # FATAL: the placeholder pane exits at once; nothing restarts it.
            self.cli = ProcStatus(ProcState.FATAL, reason=fatal)
            log.error("CLI %s cannot start: %s", self.cli_name, fatal)
            self.bus.publish(ErrorEvent(message=fatal, cli=self.cli_name))
            self._save()
            return
        # STARTING -> RUNNING: the pane's waiter has started the CLI.
        pid = await self._cli_pid(pane.pane_pid)
        self._cli_ref = ProcRef.of(pid)
        self.cli = ProcStatus(ProcState.RUNNING, pid=pid, started_at=time.monotonic())
        self._save()
        log.info("CLI %s running as pid %s: %s", self.cli_name, pid, list(argv))
        self._watch_pid(
            "cli", pane.pane_pid, lambda: self._spawn(self._on_cli_exit(gen), "cli-exit")
        )

    async def _on_cli_exit(self, gen: int) -> None:
        if gen != self._gen or self._stopping or self.cli.state is not ProcState.RUNNING:
            return  # a resleeve, a heal or shutdown stopped it on purpose
        code = await self._dead_status()
        if gen != self._gen:
            return
        ran = time.monotonic() - (self.cli.started_at or time.monotonic())
        # RUNNING -> EXITED: the CLI ended by itself.
        self.cli = replace(self.cli, state=ProcState.EXITED, exit_code=code)
        log.warning("CLI %s exited with %s after %.1fs", self.cli_name, code, ran)
        self.stats.cli_exited(code)
        self.bus.publish(CliExit(cli=self.cli_name, exit_code=code, pid=self.cli.pid))
        self._cli_ref = None
        self._save()
        policy = self.config.restart
        if policy is RestartPolicy.ALWAYS or (policy is RestartPolicy.ON_FAILURE and code != 0):
            if ran >= BACKOFF_RESET_AFTER:
                self._backoff_n = 0
            self._backoff_n += 1
            delay = backoff_delay(self._backoff_n)
            # EXITED -> BACKOFF: wait, then start it again with its resume argv.
            self.cli = replace(
                self.cli, state=ProcState.BACKOFF, reason=f"restarting in {delay:g}s"
            )
            self._restart_due = time.monotonic() + delay
            self._save()
            self._backoff_task = self._spawn(self._restart_after(delay, gen), "backoff")

    async def _cli_pid(self, waiter: int) -> int | None:
        """The CLI's pid: the pane waiter's child (it forks at once; None if already gone)."""
        deadline = time.monotonic() + 1.0
        while True:
            try:
                children = psutil.Process(waiter).children()
            except psutil.NoSuchProcess:
                return None
            if children or time.monotonic() > deadline:
                return children[0].pid if children else None
            await asyncio.sleep(0.005)

    async def _dead_status(self) -> int | None:
        """The CLI's exit code: its waiter wrote it before exiting. If the waiter itself was
        killed, ask tmux (briefly: it records a status only when it has reaped the pane)."""
        code = self.tmux.exit_status()
        if code is not None:
            return code
        deadline = time.monotonic() + 0.5
        while True:
            try:
                info = await asyncio.to_thread(self.tmux.pane_info)
            except (TmuxError, OSError):
                return None  # tmux itself is gone; its own watcher heals it
            # tmux marks the pane dead when the pty closes, and records the status when it
            # reaps the child: the two can come in either order.
            if (info.dead and info.dead_status is not None) or time.monotonic() > deadline:
                return info.dead_status
            await asyncio.sleep(0.01)

    async def _restart_after(self, delay: float, gen: int) -> None:
        await asyncio.sleep(delay)
        async with self._cli_lock:
            if gen == self._gen and not self._stopping:
                self.stats.cli_restarts += 1
                await self._launch_cli(resume=True, fresh_server=False)

    async def _on_tmux_exit(self, server_pid: int) -> None:
        if self._stopping:
            return
        async with self._cli_lock:
            if self._stopping or self.pane is None or self.pane.server_pid != server_pid:
                return
            log.error("tmux server %d died; recreating the session", server_pid)
            self.bus.publish(ErrorEvent(message="tmux server died; session recreated"))
            # Its pane's CLI got SIGHUP, but one that ignores it lives on as an orphan.
            await self._stop_pane_tree()
            self._cancel_backoff()
            self.stats.tmux_heals += 1
            await self._launch_cli(resume=True, fresh_server=True)

    def _cancel_backoff(self) -> None:
        if self._backoff_task is not None:
            self._backoff_task.cancel()
            self._backoff_task = None

    async def _stop_pane_tree(self) -> None:
        """The CLI's whole tree: SIGTERM/SIGHUP, SIGKILL what is left after the grace."""
        if self.pane is not None:
            await stop_tree(self.pane.pane_pid, self._pane_started, self.config.stop_grace)
        if self._orphan is not None:
            await stop_tree(self._orphan.pid, self._orphan.start, self.config.stop_grace)
            self._orphan = None

    # ---- resleeve ------------------------------------------------------------------------

    def begin_resleeve(self, cli_name: str | None) -> tuple[str, asyncio.Task[None]]:
        """Validate and start a resleeve; raises UnknownCLI or ResleeveBusy synchronously so the
        caller can answer 400/409 before anything happens."""
        name = cli_name or self.cli_name
        if name not in self.registry:
            msg = f"unknown CLI {name!r}; known: {', '.join(sorted(self.registry))}"
            raise UnknownCLI(msg)
        if self.resleeving or self._stopping:
            msg = "a resleeve is already in progress" if self.resleeving else "shutting down"
            raise ResleeveBusy(msg)
        self.resleeving = True
        return name, self._spawn(self._resleeve(name), "resleeve")

    async def resleeve(self, cli_name: str | None = None) -> None:
        _, task = self.begin_resleeve(cli_name)
        await task

    async def _resleeve(self, name: str) -> None:
        began = time.monotonic()
        try:
            async with self._cli_lock:
                previous = self.cli_name
                self.bus.publish(Resleeve(phase="started", previous=previous, cli=name))
                await self._resleeve_steps(previous, name, stop_first=True)
                self.stats.resleeved(time.monotonic() - began)
        finally:
            self.resleeving = False

    async def _finish_resleeve(self, previous: str, name: str, *, stop_first: bool) -> None:
        """The rest of a resleeve a crashed supervisor began (caller holds `_cli_lock`)."""
        self.resleeving = True
        try:
            await self._resleeve_steps(previous, name, stop_first=stop_first)
        finally:
            self.resleeving = False

    async def _resleeve_steps(self, previous: str, name: str, *, stop_first: bool) -> None:
        """Stop the CLI's tree, start `name` with its resume argv (caller holds `_cli_lock`).
        Each step is saved before it is taken, so that a supervisor that crashes half way
        leaves a state file from which the next one finishes the resleeve."""
        self._resleeve_move = (previous, name)
        if stop_first:
            self._cancel_backoff()
            # RUNNING/EXITED/BACKOFF -> STOPPING: exits from here on are ours.
            self.cli = replace(self.cli, state=ProcState.STOPPING)
            self._save()
            self._unwatch("cli")
            await self._stop_pane_tree()
            self.cli_name = name
            self._backoff_n = 0
            # Another CLI starts with its command: its resume argv would look for a
            # conversation of its own that this workspace never had.
            await self._launch_cli(resume=name == previous, fresh_server=self.pane is None)
        self._resleeve_move = None
        self._save()
        self.bus.publish(
            Resleeve(
                phase="done", previous=previous, cli=name, pid=self.cli.pid, state=self.cli.state
            )
        )

    # ---- periodic ------------------------------------------------------------------------

    async def _tick(self) -> None:
        socket = os.fspath(self.config.tmux_socket)
        while not self._stopping:
            await asyncio.sleep(TICK)
            self._tick_once(socket)

    def _tick_once(self, socket: str) -> None:
        """The only periodic work: a few `stat` calls (it is most of an idle sleeve's CPU)."""
        self.current.get()  # CURRENT.md edits become events within a second
        self.awareness.tick()  # an inbox notice, if one is due
        pane = self.pane
        if pane is not None and not os.path.exists(socket):
            log.warning("tmux socket %s vanished; asking tmux to recreate it", socket)
            recreate_socket(pane.server_pid)

    # ---- shutdown ------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """CLI tree (within the grace), then ttyd, then tmux; CURRENT.md says `killed`."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down")
        # A supervisor that crashes from here on is started again only to finish this.
        self._save()
        self._cancel_backoff()
        self._unwatch("tmux")
        # A resleeve or heal under way finishes its stop first and then starts nothing
        # (`_launch_cli` checks `_stopping`); only then is the pane's tree stopped here.
        async with self._cli_lock:
            self._unwatch("cli")
            if self.pane is not None or self._orphan is not None:
                # -> STOPPING -> STOPPED
                self.cli = replace(self.cli, state=ProcState.STOPPING)
                await self._stop_pane_tree()
        await self.awareness.stop()
        await self.ttyd.stop()
        await asyncio.to_thread(self.tmux.kill_server)
        if self.pane is not None:
            # kill-server returns once the tmux client is done; the server exits a moment later.
            # Wait for it, so that it never outlives us (as PID 1's last act, that would leave
            # it to the kernel's SIGKILL).
            await wait_exited([self.pane.server_pid], 2.0)
        self.cli = replace(self.cli, state=ProcState.STOPPED)
        try:
            await asyncio.to_thread(
                cstack_files.write_status,
                self.current.path,
                "killed",
                self.config.workspace,
                self.owner,
            )
        except OSError as exc:
            log.warning("could not mark CURRENT.md killed: %s", exc)
        # Nothing is left to adopt.
        self._init = None  # no more saves
        persist.remove(self.state_file)
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("stopped")

    @property
    def healthy(self) -> bool:
        return self.cli.state is ProcState.RUNNING
