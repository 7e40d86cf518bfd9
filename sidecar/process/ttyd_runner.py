"""Running ttyd: `TtydRunner` keeps it running (with backoff), says when it is usable, and stops
the ttyd a dead supervisor left behind. What ttyd is and how it is called:
`sidecar.process.ttyd`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sidecar.core.event_shapes import ErrorEvent
from sidecar.core.events import EventBus
from sidecar.core.layout import Layout
from sidecar.core.proc import cmdline, parent_death_signal, send_signal
from sidecar.core.states import ProcessState, ProcState, ProcStatus
from sidecar.process.deaths import Death
from sidecar.process.persist import ProcRef
from sidecar.process.pidfd import wait_exited
from sidecar.process.ttyd import Credential, TtydNotFound, Upstream, find_ttyd, port_free, ttyd_argv
from sidecar.security.users import User, spawn_credentials

log = logging.getLogger(__name__)


async def wait_port(host: str, port: int, deadline: float) -> bool:
    """Poll until something accepts on host:port or the monotonic `deadline` passes."""
    return await _wait_accepting(lambda: asyncio.open_connection(host, port), deadline)


async def wait_unix(path: Path, deadline: float) -> bool:
    """Poll until something accepts on the unix socket `path` or `deadline` passes."""
    return await _wait_accepting(lambda: asyncio.open_unix_connection(str(path)), deadline)


async def _wait_accepting(
    connect: Callable[[], Coroutine[Any, Any, tuple[asyncio.StreamReader, asyncio.StreamWriter]]],
    deadline: float,
) -> bool:
    delay = 0.005
    while True:
        try:
            _, writer = await connect()
        except OSError:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return True


READY_WITHIN = 5.0  # seconds from spawn until ttyd must accept connections
STALE_WAIT = 2.0  # seconds a dead supervisor's ttyd gets to vanish after SIGKILL


def is_our_ttyd(pid: int, tmux_socket: Path) -> bool:
    """Whether `pid` runs ttyd attached to `tmux_socket` (what `ttyd_argv` builds)."""
    argv = cmdline(pid)
    return argv is not None and b"--base-path" in argv and os.fsencode(tmux_socket) in argv


async def stop_stale(ttyd: ProcRef, tmux_socket: Path) -> bool:
    """SIGKILL the ttyd a dead supervisor started, and wait until it is gone: it holds the port
    and a credential nobody knows any more. Its parent-death signal kills it too, but maybe not
    before a new supervisor wants the port. Whether there was one to stop."""
    if not is_our_ttyd(ttyd.pid, tmux_socket) or not send_signal(
        ttyd.pid, ttyd.start, signal.SIGKILL
    ):
        return False
    await wait_exited([ttyd.pid], STALE_WAIT)
    return True


@dataclass(frozen=True)
class TtydStatus(ProcStatus):
    """ttyd's record: its status, and the ttyd process from its spawn until it has exited (the
    state file keeps it, for a supervisor started again to stop it: `stop_stale`)."""

    process: ProcRef | None = None


_S = ProcState
#: ttyd's legal moves: it has no EXITED of its own (an exit goes straight to BACKOFF) and is
#: stopped from any state; FATAL: no binary to start.
TTYD_MOVES: dict[ProcState, frozenset[ProcState]] = {
    _S.STOPPED: frozenset({_S.STARTING, _S.FATAL}),
    _S.STARTING: frozenset({_S.RUNNING, _S.BACKOFF, _S.STOPPED}),
    _S.RUNNING: frozenset({_S.BACKOFF, _S.STOPPED}),
    _S.BACKOFF: frozenset({_S.STARTING, _S.FATAL, _S.STOPPED}),
    _S.FATAL: frozenset({_S.STOPPED}),
    _S.EXITED: frozenset(),
    _S.STOPPING: frozenset(),
}


class TtydRunner:
    """Keeps ttyd running: find it, check its port, start it (with a new credential in port
    mode), wait until it accepts, and start it again (with backoff) when it exits. `status` is
    what /status shows. `run_as` (SIDECAR_USER): ttyd and its tmux clients run as that user."""

    def __init__(
        self,
        *,
        port: int | None,
        paths: Layout,
        path_env: str | None,
        bus: EventBus,
        on_change: Callable[[], None] | None = None,
        run_as: User | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = port
        self.socket_path = None if port is not None else paths.ttyd_socket
        self.run_as = run_as
        self.env = dict(env) if env is not None else None
        self.tmux_socket = paths.tmux_socket
        self.ttyd_copy = paths.ttyd_copy
        self.path_env = path_env
        self.bus = bus
        self.on_change = on_change  # called when `status` changed
        self._state = ProcessState(self._changed, TTYD_MOVES, initial=TtydStatus())
        # The running ttyd's credential (new on every start); only the /terminal proxy uses it.
        self.credential: Credential | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._changed_event = asyncio.Event()
        self._stopping = False
        self._log_tasks: set[asyncio.Task[None]] = set()

    @property
    def status(self) -> TtydStatus:
        return self._state.status

    def _changed(self, old: TtydStatus, new: TtydStatus, restored: bool) -> None:
        self._changed_event.set()
        self._changed_event = asyncio.Event()
        if self.on_change is not None:
            self.on_change()

    async def usable(self, timeout: float = READY_WITHIN) -> Upstream | None:
        """How to reach the running ttyd; while ttyd is (about to be) starting, wait for it up
        to `timeout` seconds. None when it is not running (backoff, fatal, stopped)."""
        deadline = time.monotonic() + timeout
        while self.status.state in (ProcState.STOPPED, ProcState.STARTING) and not self._stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._changed_event.wait(), remaining)
            except TimeoutError:
                break
        if self.status.state is not ProcState.RUNNING:
            return None
        if self.socket_path is not None:
            return Upstream("http://localhost", self.socket_path, None)
        return Upstream(f"http://127.0.0.1:{self.port}", None, self.credential)

    async def run(self) -> None:
        """Run ttyd until `stop()`; a ttyd that exits is started again after a backoff."""
        while not self._stopping:
            try:
                binary = await asyncio.to_thread(find_ttyd, self.ttyd_copy, self.path_env)
            except TtydNotFound as exc:
                # -> FATAL: nothing to start; a new binary needs a new sidecar.
                self._state.change(TtydStatus(ProcState.FATAL, reason=str(exc)))
                log.error("%s", exc)
                self.bus.publish(ErrorEvent(message=str(exc)))
                return
            started = time.monotonic()
            # STOPPED/BACKOFF -> STARTING, its backoff's count kept.
            self._state.change(
                TtydStatus(ProcState.STARTING, started_at=started, failures=self.status.failures)
            )
            code, problem = await self._once(binary, started)
            if self._stopping:
                break
            # STARTING/RUNNING -> BACKOFF: ttyd could not start or died; try again after the delay.
            delay = self._state.back_off(TtydStatus(exit_code=code), problem)
            log.warning("ttyd: %s; retrying in %gs", problem, delay)
            self.bus.publish(ErrorEvent(message=f"ttyd: {problem}; retrying"))
            await asyncio.sleep(delay)

    async def _once(self, binary: str, started: float) -> tuple[int | None, str]:
        """Run ttyd until it exits; returns its exit code and what went wrong."""
        credential: Credential | None = None
        if self.socket_path is not None:
            # A socket file left by an earlier ttyd (it does not remove its own).
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        else:
            assert self.port is not None
            if not port_free("127.0.0.1", self.port):
                # Checked first: another program's listener would pass the readiness probe,
                # and /terminal would then proxy to it.
                return None, f"TTYD_PORT {self.port} is in use by another program"
            credential = Credential.new()
        argv = ttyd_argv(
            binary,
            tmux_socket=self.tmux_socket,
            socket_path=self.socket_path,
            port=self.port,
            credential=credential,
        )
        self.credential = credential
        arm, supervisor = parent_death_signal(signal.SIGKILL), os.getpid()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self.env,
                **spawn_credentials(self.run_as),
                # ttyd dies with the supervisor that started it (its credential dies there too),
                # so a crashed supervisor leaves no ttyd holding the port. subprocess runs this
                # after any user/group change it makes, which would clear the setting.
                preexec_fn=lambda: arm(supervisor),
            )
        except OSError as exc:
            return None, f"cannot start {binary}: {exc.strerror}"
        self._proc = proc
        # Still STARTING, now with the process a crash must not leave behind.
        self._state.amend(replace(self.status, process=ProcRef.of(proc.pid)))
        # Ends by itself when ttyd's output closes; cancelled at stop() should a child hold it.
        task = asyncio.create_task(self._forward_output(proc, credential), name="ttyd-log")
        self._log_tasks.add(task)
        task.add_done_callback(self._log_tasks.discard)
        if self.socket_path is not None:
            ready = await wait_unix(self.socket_path, started + READY_WITHIN)
        else:
            assert self.port is not None
            ready = await wait_port("127.0.0.1", self.port, started + READY_WITHIN)
        if not ready and proc.returncode is None:
            proc.kill()
            await proc.wait()
            return proc.returncode, f"not accepting connections within {READY_WITHIN:g}s"
        if proc.returncode is None:
            # STARTING -> RUNNING: ttyd accepts connections.
            self._state.change(replace(self.status, state=ProcState.RUNNING, pid=proc.pid))
            where = self.socket_path or f"127.0.0.1:{self.port}"
            log.info("ttyd running as pid %d on %s", proc.pid, where)
        code = await proc.wait()
        return code, Death.of_returncode(code).describe()

    @staticmethod
    async def _forward_output(
        proc: asyncio.subprocess.Process, credential: Credential | None
    ) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            # ttyd prints its credential at start-up, at a debug level above ours (3): redacted
            # anyway, should the level ever change.
            line = raw.decode("utf-8", "replace").rstrip()
            if credential is not None:
                line = credential.redact(line)
            if line:
                log.info("ttyd: %s", line)

    async def stop(self) -> None:
        """Stop ttyd (SIGTERM, SIGKILL after 2 s); `run()` then returns."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 2.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for task in list(self._log_tasks):
            task.cancel()
        await asyncio.gather(*self._log_tasks, return_exceptions=True)
        if self.status.state is not ProcState.STOPPED:
            # -> STOPPED
            self._state.change(TtydStatus(ProcState.STOPPED))
