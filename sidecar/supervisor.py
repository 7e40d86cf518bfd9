"""Owns the processes: the tmux session with the AI CLI in it, and ttyd attached to it.

Start and stop order, the restart policy with backoff, self-healing when tmux dies, and the
soft resleeve (stop the CLI's whole tree, start the next CLI in the same pane). Process exits
are noticed through pidfds on the event loop, never by polling tmux.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from sidecar import cstack_files
from sidecar.awareness import Awareness
from sidecar.clis import CLIDef, claude_has_history
from sidecar.config import Config, RestartPolicy
from sidecar.events import EventBus
from sidecar.proc import start_time
from sidecar.proctree import stop_tree, wait_exited
from sidecar.shapes import CliExit, ErrorEvent, Resleeve
from sidecar.states import BACKOFF_RESET_AFTER, ProcState, ProcStatus, backoff_delay
from sidecar.tmux import SESSION, PaneInfo, Tmux, TmuxError, recreate_socket
from sidecar.ttyd import TtydRunner
from sidecar.watch import CurrentWatcher

log = logging.getLogger(__name__)

TICK = 1.0  # the only periodic work: one stat of CURRENT.md and of the tmux socket
# What the pane runs instead of a CLI that cannot start: the reason, kept on screen. (When a
# pane dies, tmux 3.3a moves its screen into the history, so a browser attaching later would
# see only "Pane is dead".) The reason is a positional parameter, never parsed as shell syntax.
FATAL_PANE_SCRIPT = 'printf "sidecar: %s\\n" "$1"; exec sleep infinity'
SECRET_VARS = ("SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN")


class ResleeveBusy(Exception):
    """A resleeve is already in progress."""


class UnknownCLI(Exception):
    """The requested CLI is not in the registry."""


class Supervisor:
    def __init__(self, config: Config, registry: Mapping[str, CLIDef], bus: EventBus) -> None:
        self.config = config
        self.registry = dict(registry)
        self.bus = bus
        self.cli_name = config.cli
        # What the agent is doing (sidecar.agent): told of every change of the CLI's state.
        self.awareness = Awareness(config, bus)
        self.cli = ProcStatus()
        self.ttyd = TtydRunner(
            port=config.ttyd_port,
            tmux_socket=config.tmux_socket,
            session=SESSION,
            state_dir=config.state_dir,
            path_env=config.child_env.get("PATH"),
            bus=bus,
        )
        self.started = time.monotonic()
        self.warnings: list[str] = []
        self.current = CurrentWatcher(config.workspace / ".cstack" / "CURRENT.md", bus)
        self.tmux = Tmux(
            config.tmux_socket, config.state_dir / "tmux.conf", config.state_dir / "cli.status"
        )
        self.pane: PaneInfo | None = None
        self._pane_started: float | None = None  # the pane process's start time (pid reuse)
        self.resleeving = False
        self._stopping = False
        self._gen = 0  # bumped on every CLI launch; stale exit notices compare against it
        self._backoff_n = 0
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
            log.error("task %s failed", task.get_name(), exc_info=task.exception())
            self.bus.publish(ErrorEvent(message=f"internal task {task.get_name()} failed"))

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
        path = {**self.config.child_env, **env}.get("PATH", os.defpath)
        if shutil.which(argv[0], path=path) is None:
            fatal = f"{argv[0]!r} not found on PATH ({path}); the {cli.name} CLI is not installed"
            return argv, env, fatal
        return argv, env, None

    def _argv_for(self, cli: CLIDef, *, resume: bool) -> tuple[str, ...]:
        env = self.config.child_env
        history = claude_has_history(
            self.config.workspace,
            Path(env.get("HOME", "/root")),
            Path(env["CLAUDE_CONFIG_DIR"]) if env.get("CLAUDE_CONFIG_DIR") else None,
        )
        argv = cli.argv(resume=resume, has_history=history)
        return self.awareness.launch_argv(cli, argv, has_history=history)

    # ---- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start tmux with the CLI, then ttyd. The state dir exists already (0700): `main`
        makes it before anything starts, so that an unusable one is a configuration error."""
        cfg = self.config
        for var in SECRET_VARS:
            # Children (tmux, the CLI, ttyd) must not inherit the API's tokens.
            os.environ.pop(var, None)
        try:
            cfg.workspace.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.warnings.append(f"workspace {cfg.workspace} cannot be created: {exc.strerror}")
        if cfg.workspace.is_dir() and not os.access(cfg.workspace, os.W_OK):
            self.warnings.append(f"workspace {cfg.workspace} is read-only")
        if cfg.goal:
            try:
                await asyncio.to_thread(cstack_files.write_goal, self.current.path, cfg.goal)
            except OSError as exc:
                self.warnings.append(f"SLEEVE_GOAL not written to CURRENT.md: {exc.strerror}")
        self.current.get()
        self.awareness.start()
        # ttyd starts beside the CLI, not after it: it needs the tmux session only when a
        # browser attaches, and /terminal must be usable as soon as /health says healthy.
        self._spawn(self.ttyd.run(), "ttyd")
        async with self._cli_lock:
            await self._launch_cli(resume=False, fresh_server=True)
        self._spawn(self._tick(), "tick")

    async def _launch_cli(self, *, resume: bool, fresh_server: bool) -> None:
        """Start the current CLI in the pane (caller holds `_cli_lock`)."""
        if self._stopping:
            return
        argv, env, fatal = self._plan_launch(resume=resume)
        if fatal is not None:
            # The session must exist for the terminal; its pane says what is wrong.
            argv, env = ("sh", "-c", FATAL_PANE_SCRIPT, "sidecar-fatal", fatal), {}
        self._gen += 1
        gen = self._gen
        self.cli = ProcStatus(ProcState.STARTING)
        try:
            if fresh_server:
                pane = await asyncio.to_thread(self.tmux.start, argv, self.config.workspace, env)
            else:
                pane = await asyncio.to_thread(self.tmux.respawn, argv, self.config.workspace, env)
        except (TmuxError, OSError) as exc:
            self.cli = ProcStatus(ProcState.FATAL, reason=f"tmux failed: {exc}")
            log.error("cannot start the CLI in tmux: %s", exc)
            self.bus.publish(ErrorEvent(message=self.cli.reason or "tmux failed"))
            return
        self.pane = pane
        self._pane_started = start_time(pane.pane_pid)
        if fresh_server:
            self._watch_pid(
                "tmux",
                pane.server_pid,
                lambda: self._spawn(self._on_tmux_exit(pane.server_pid), "heal"),
            )
        if fatal is not None:
            # FATAL: the placeholder pane exits at once; nothing restarts it.
            self.cli = ProcStatus(ProcState.FATAL, reason=fatal)
            log.error("CLI %s cannot start: %s", self.cli_name, fatal)
            self.bus.publish(ErrorEvent(message=fatal, cli=self.cli_name))
            return
        # STARTING -> RUNNING: the pane's waiter has started the CLI.
        pid = await self._cli_pid(pane.pane_pid)
        self.cli = ProcStatus(ProcState.RUNNING, pid=pid, started_at=time.monotonic())
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
        self.bus.publish(CliExit(cli=self.cli_name, exit_code=code, pid=self.cli.pid))
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
            await self._launch_cli(resume=True, fresh_server=True)

    def _cancel_backoff(self) -> None:
        if self._backoff_task is not None:
            self._backoff_task.cancel()
            self._backoff_task = None

    async def _stop_pane_tree(self) -> None:
        """The CLI's whole tree: SIGTERM/SIGHUP, SIGKILL what is left after the grace."""
        if self.pane is not None:
            await stop_tree(self.pane.pane_pid, self._pane_started, self.config.stop_grace)

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
        try:
            async with self._cli_lock:
                previous = self.cli_name
                self.bus.publish(Resleeve(phase="started", previous=previous, cli=name))
                self._cancel_backoff()
                # RUNNING/EXITED/BACKOFF -> STOPPING: exits from here on are ours.
                self.cli = replace(self.cli, state=ProcState.STOPPING)
                self._unwatch("cli")
                if self.pane is not None:
                    await self._stop_pane_tree()
                self.cli_name = name
                self._backoff_n = 0
                # Another CLI starts with its command: its resume argv would look for a
                # conversation of its own that this workspace never had.
                await self._launch_cli(resume=name == previous, fresh_server=self.pane is None)
                self.bus.publish(
                    Resleeve(
                        phase="done",
                        previous=previous,
                        cli=name,
                        pid=self.cli.pid,
                        state=self.cli.state,
                    )
                )
        finally:
            self.resleeving = False

    # ---- periodic ------------------------------------------------------------------------

    async def _tick(self) -> None:
        while not self._stopping:
            await asyncio.sleep(TICK)
            self.current.get()  # CURRENT.md edits become events within a second
            self.awareness.tick()  # an inbox notice, if one is due
            pane = self.pane
            if pane is not None and not self.config.tmux_socket.exists():
                log.warning(
                    "tmux socket %s vanished; asking tmux to recreate it", self.config.tmux_socket
                )
                recreate_socket(pane.server_pid)

    # ---- shutdown ------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """CLI tree (within the grace), then ttyd, then tmux; CURRENT.md says `killed`."""
        if self._stopping:
            return
        self._stopping = True
        log.info("shutting down")
        self._cancel_backoff()
        self._unwatch("tmux")
        # A resleeve or heal under way finishes its stop first and then starts nothing
        # (`_launch_cli` checks `_stopping`); only then is the pane's tree stopped here.
        async with self._cli_lock:
            self._unwatch("cli")
            if self.pane is not None:
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
            await asyncio.to_thread(cstack_files.write_status, self.current.path, "killed")
        except OSError as exc:
            log.warning("could not mark CURRENT.md killed: %s", exc)
        for task in list(self._tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        log.info("stopped")

    @property
    def healthy(self) -> bool:
        return self.cli.state is ProcState.RUNNING
