"""Owns the processes: the tmux session with the AI CLI in it, and ttyd attached to it.

Start and stop order, the restart policy with backoff, self-healing when tmux dies, and the
soft resleeve (stop the CLI's whole tree, start the next CLI in the same pane). Process exits
are noticed through pidfds on the event loop, never by polling tmux.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

import psutil

from sidecar import cstack
from sidecar.clis import CLIDef, claude_has_history
from sidecar.config import Config, RestartPolicy
from sidecar.events import EventBus
from sidecar.proc import start_time
from sidecar.tmux import SESSION, PaneInfo, Tmux, TmuxError, recreate_socket
from sidecar.ttyd import Credential, TtydNotFound, find_ttyd, port_free, ttyd_argv, wait_port
from sidecar.watch import CurrentWatcher

log = logging.getLogger(__name__)

BACKOFF_START, BACKOFF_CAP = 1.0, 30.0
# A CLI that stayed up this long is healthy again: its next failure starts the backoff anew.
BACKOFF_RESET_AFTER = 10.0
TTYD_READY_WITHIN = 5.0  # seconds from spawn until ttyd must accept connections
TICK = 1.0  # the only periodic work: one stat of CURRENT.md and of the tmux socket
# What the pane runs instead of a CLI that cannot start: the reason, kept on screen. (When a
# pane dies, tmux 3.3a moves its screen into the history, so a browser attaching later would
# see only "Pane is dead".) The reason is a positional parameter, never parsed as shell syntax.
FATAL_PANE_SCRIPT = 'printf "sidecar: %s\\n" "$1"; exec sleep infinity'
SECRET_VARS = ("SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN")


class ProcState(Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    EXITED = "exited"
    FATAL = "fatal"


class ResleeveBusy(Exception):
    """A resleeve is already in progress."""


class UnknownCLI(Exception):
    """The requested CLI is not in the registry."""


@dataclass(frozen=True)
class ProcStatus:
    state: ProcState = ProcState.STOPPED
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    started_at: float | None = None  # time.monotonic()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_exited(pids: list[int], timeout: float) -> set[int]:
    """Wait (on pidfds, no polling) until every pid has exited; return those still alive."""
    loop = asyncio.get_running_loop()
    waiters: dict[int, asyncio.Future[None]] = {}
    fds: list[int] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # already gone and reaped
        fds.append(fd)
        fut: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _resolve, fut)
        waiters[pid] = fut
    try:
        if waiters:
            await asyncio.wait(waiters.values(), timeout=timeout)
        return {pid for pid, fut in waiters.items() if not fut.done()}
    finally:
        for fd in fds:
            loop.remove_reader(fd)
            os.close(fd)


def _collect_tree(root: int, root_started: float | None) -> list[psutil.Process]:
    """The CLI's process tree: descendants of the pane process, plus anything still in its
    session (a background job orphaned earlier has left the tree but not the session).

    The pane process is only taken for itself when its start time is still `root_started`: a
    pane that died long ago may have left its pid to an unrelated process. Session members need
    no such check, as the kernel never hands out a pid that is still some process's session id.
    """
    procs: dict[int, psutil.Process] = {}
    try:
        top = psutil.Process(root)
        if root_started is not None and start_time(root) == root_started:
            procs[root] = top
            for child in top.children(recursive=True):
                procs[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    for pid in psutil.pids():
        if pid in procs or pid == os.getpid():
            continue
        try:
            if os.getsid(pid) == root:
                procs[pid] = psutil.Process(pid)
        except (OSError, psutil.Error):
            continue
    return list(procs.values())


def _signal_all(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        # psutil checks the create time first, so a recycled pid is never signalled.
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


class Supervisor:
    def __init__(self, config: Config, registry: Mapping[str, CLIDef], bus: EventBus) -> None:
        self.config = config
        self.registry = dict(registry)
        self.bus = bus
        self.cli_name = config.cli
        self.cli = ProcStatus()
        self.ttyd = ProcStatus()
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
        self._ttyd_proc: asyncio.subprocess.Process | None = None
        # The running ttyd's --credential (new on every start); only the /terminal proxy uses it.
        self.ttyd_credential: Credential | None = None

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
            self.bus.publish("error", message=f"internal task {task.get_name()} failed")

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
        return cli.argv(resume=resume, has_history=history)

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
                await asyncio.to_thread(cstack.write_goal, self.current.path, cfg.goal)
            except OSError as exc:
                self.warnings.append(f"SLEEVE_GOAL not written to CURRENT.md: {exc.strerror}")
        self.current.get()
        async with self._cli_lock:
            await self._launch_cli(resume=False, fresh_server=True)
        self._spawn(self._run_ttyd(), "ttyd")
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
            self.bus.publish("error", message=self.cli.reason)
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
            self.bus.publish("error", message=fatal, cli=self.cli_name)
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
        self.bus.publish("cli-exit", cli=self.cli_name, exit_code=code, pid=self.cli.pid)
        policy = self.config.restart
        if policy is RestartPolicy.ALWAYS or (policy is RestartPolicy.ON_FAILURE and code != 0):
            if ran >= BACKOFF_RESET_AFTER:
                self._backoff_n = 0
            delay = min(BACKOFF_START * 2**self._backoff_n, BACKOFF_CAP)
            self._backoff_n += 1
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
            self.bus.publish("error", message="tmux server died; session recreated")
            # Its pane's CLI got SIGHUP, but one that ignores it lives on as an orphan.
            await self._stop_pane_tree()
            self._cancel_backoff()
            await self._launch_cli(resume=True, fresh_server=True)

    def _cancel_backoff(self) -> None:
        if self._backoff_task is not None:
            self._backoff_task.cancel()
            self._backoff_task = None

    async def _stop_pane_tree(self) -> None:
        """SIGTERM (and SIGHUP) to the whole CLI tree, SIGKILL what is left after the grace."""
        if self.pane is None:
            return
        procs = await asyncio.to_thread(_collect_tree, self.pane.pane_pid, self._pane_started)
        if not procs:
            return
        _signal_all(procs, signal.SIGTERM)
        # SIGHUP as a closing terminal would send it: an interactive shell ignores SIGTERM.
        _signal_all(procs, signal.SIGHUP)
        _signal_all(procs, signal.SIGCONT)  # a stopped process cannot act on either
        alive = await wait_exited([p.pid for p in procs], self.config.stop_grace)
        if alive:
            log.warning(
                "SIGKILL to %d processes that outlived %.1fs", len(alive), self.config.stop_grace
            )
            _signal_all([p for p in procs if p.pid in alive], signal.SIGKILL)
            await wait_exited(list(alive), 5.0)

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
                self.bus.publish("resleeve", phase="started", previous=previous, cli=name)
                self._cancel_backoff()
                # RUNNING/EXITED/BACKOFF -> STOPPING: exits from here on are ours.
                self.cli = replace(self.cli, state=ProcState.STOPPING)
                self._unwatch("cli")
                if self.pane is not None:
                    await self._stop_pane_tree()
                self.cli_name = name
                self._backoff_n = 0
                await self._launch_cli(resume=True, fresh_server=self.pane is None)
                self.bus.publish(
                    "resleeve",
                    phase="done",
                    previous=previous,
                    cli=name,
                    pid=self.cli.pid,
                    state=self.cli.state.value,
                )
        finally:
            self.resleeving = False

    # ---- ttyd ----------------------------------------------------------------------------

    async def _run_ttyd(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                binary = await asyncio.to_thread(
                    find_ttyd, self.config.state_dir, self.config.child_env.get("PATH")
                )
            except TtydNotFound as exc:
                self.ttyd = ProcStatus(ProcState.FATAL, reason=str(exc))
                log.error("%s", exc)
                self.bus.publish("error", message=str(exc))
                return
            started = time.monotonic()
            self.ttyd = ProcStatus(ProcState.STARTING)
            code, problem = await self._ttyd_once(binary, started)
            if self._stopping:
                break
            failures = 0 if time.monotonic() - started >= BACKOFF_RESET_AFTER else failures + 1
            delay = min(BACKOFF_START * 2 ** max(failures - 1, 0), BACKOFF_CAP) if failures else 0.1
            # STARTING/RUNNING -> BACKOFF: ttyd could not start or died; try again after the delay.
            self.ttyd = ProcStatus(
                ProcState.BACKOFF, exit_code=code, reason=f"{problem}; retry in {delay:g}s"
            )
            log.warning("ttyd: %s; retrying in %gs", problem, delay)
            self.bus.publish("error", message=f"ttyd: {problem}; retrying")
            await asyncio.sleep(delay)

    async def _ttyd_once(self, binary: str, started: float) -> tuple[int | None, str]:
        """Run ttyd until it exits; returns its exit code and what went wrong."""
        port = self.config.ttyd_port
        if not port_free("127.0.0.1", port):
            # Checked first: another program's listener would pass the readiness probe, and
            # /terminal would then proxy to it.
            return None, f"TTYD_PORT {port} is in use by another program"
        credential = Credential.new()
        argv = ttyd_argv(
            binary,
            port=port,
            tmux_socket=self.config.tmux_socket,
            session=SESSION,
            credential=credential,
        )
        self.ttyd_credential = credential
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as exc:
            return None, f"cannot start {binary}: {exc.strerror}"
        self._ttyd_proc = proc
        self._spawn(self._forward_output(proc, credential), "ttyd-log")
        ready = await wait_port("127.0.0.1", port, started + TTYD_READY_WITHIN)
        if not ready and proc.returncode is None:
            proc.kill()
            await proc.wait()
            return proc.returncode, f"not accepting connections within {TTYD_READY_WITHIN:g}s"
        if proc.returncode is None:
            # STARTING -> RUNNING: ttyd accepts connections.
            self.ttyd = ProcStatus(ProcState.RUNNING, pid=proc.pid, started_at=started)
            log.info("ttyd running as pid %d on 127.0.0.1:%d", proc.pid, port)
        code = await proc.wait()
        return code, f"exited with {code}"

    async def _forward_output(
        self, proc: asyncio.subprocess.Process, credential: Credential
    ) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            # ttyd prints its credential at start-up, at a debug level above ours (3): redacted
            # anyway, should the level ever change.
            line = credential.redact(raw.decode("utf-8", "replace").rstrip())
            if line:
                log.info("ttyd: %s", line)

    # ---- periodic ------------------------------------------------------------------------

    async def _tick(self) -> None:
        while not self._stopping:
            await asyncio.sleep(TICK)
            self.current.get()  # CURRENT.md edits become events within a second
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
        proc = self._ttyd_proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.ttyd = replace(self.ttyd, state=ProcState.STOPPED)
        await asyncio.to_thread(self.tmux.kill_server)
        if self.pane is not None:
            # kill-server returns once the tmux client is done; the server exits a moment later.
            # Wait for it, so that it never outlives us (as PID 1's last act, that would leave
            # it to the kernel's SIGKILL).
            await wait_exited([self.pane.server_pid], 2.0)
        self.cli = replace(self.cli, state=ProcState.STOPPED)
        try:
            await asyncio.to_thread(cstack.write_status, self.current.path, "killed")
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
