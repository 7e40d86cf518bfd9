"""The tmux server that hosts the CLI's pane, as a process the supervisor owns: which server it
is (pid and start time), its pane, and starting the CLI in it.

Whether a launch needs a fresh server is decided by the server's identity, never by a pane
object that may still name a server that died: a launch that fails leaves no pane behind.
"""

from __future__ import annotations

import asyncio
import functools
import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from sidecar.core.proc import send_signal, start_time
from sidecar.pane.tmux import PaneInfo, Tmux
from sidecar.process.persist import ProcRef


class TmuxServer:
    """`quiet`: what holds tmux's control clients still while the pane is respawned
    (`PaneActivity.paused`: tmux up to 3.6a can die respawning a pane such a client is behind
    on)."""

    def __init__(self, tmux: Tmux, quiet: Callable[[], AbstractAsyncContextManager[None]]) -> None:
        self.tmux = tmux
        self.quiet = quiet
        self.ref: ProcRef | None = None  # the server, once a pane in it is ours
        self.pane: PaneInfo | None = None
        self.pane_started: float | None = None  # the pane process's start time (pid reuse)

    def alive(self) -> bool:
        """Whether our pane's server still runs (the very process, not a reused pid)."""
        return self.pane is not None and self.ref is not None and self.ref.alive()

    @property
    def pane_ref(self) -> ProcRef | None:
        pane, started = self.pane, self.pane_started
        return ProcRef(pane.pane_pid, started) if pane is not None and started is not None else None

    async def launch(
        self,
        argv: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        *,
        fresh: bool,
        export: bool = True,
    ) -> PaneInfo:
        """Run `argv` in our pane: in a new server (`fresh`: any old one is killed), else in the
        live server's pane (`export`: `Tmux.pane_argv`). Raises TmuxError or OSError; then
        nothing is ours any more."""
        run = functools.partial(self.tmux.start if fresh else self.tmux.respawn, export=export)
        try:
            if fresh:
                pane = await asyncio.to_thread(run, argv, cwd, env)
                self.take(pane, None)
            else:
                async with self.quiet():
                    pane = await asyncio.to_thread(run, argv, cwd, env)
                self.pane, self.pane_started = pane, start_time(pane.pane_pid)
        except BaseException:
            self.forget()
            raise
        return pane

    def take(self, live: PaneInfo, recorded: ProcRef | None) -> None:
        """Make `live` our pane (`recorded`: the same pane as a dead supervisor saw it)."""
        self.pane = live
        same = recorded is not None and recorded.pid == live.pane_pid
        self.pane_started = recorded.start if same and recorded else start_time(live.pane_pid)
        self.ref = ProcRef.of(live.server_pid)

    def forget(self) -> None:
        """The server is gone or no longer ours: the next launch starts a fresh one."""
        self.ref = self.pane = self.pane_started = None

    def recreate_socket(self) -> bool:
        """Have our server make its socket again (`recreate_socket`). Whether it was asked."""
        return self.ref is not None and recreate_socket(self.ref)


def recreate_socket(server: ProcRef) -> bool:
    """tmux recreates its socket on SIGUSR1 (agents have been seen to `rm -rf` it): sent to
    `server` only if it is still that process. Whether it was sent."""
    return send_signal(server.pid, server.start, signal.SIGUSR1)
