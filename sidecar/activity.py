"""When the CLI last wrote to its pane, learnt from tmux itself: a control-mode client
(`tmux -C attach`) gets an `%output` line when the pane writes, one wakeup per burst and nothing
while the pane is quiet (why not the tty's mtime or `capture-pane`: docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable

import psutil

from sidecar.contract import TMUX_SESSION
from sidecar.tmux import Tmux

log = logging.getLogger(__name__)

# On the first `%output` the client pauses the pane for itself (`refresh-client -A %N:pause`:
# tmux keeps reading the pane and drops only this client's copy) and continues it SAMPLE seconds
# later: output is known to within SAMPLE, what the `activity` source and POST /input's hold need.
SAMPLE = 0.25  # seconds the pane stays paused for this client after output
OUTPUT_RE = re.compile(rb"(?:^|\n)%(?:extended-)?output (%\d+) ")


ENDS_WITHIN = 1.0  # seconds a control client whose output closed gets to exit by itself


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a client whose output closed (its server went away, or it was told to go),
    killing it only if it does not exit within ENDS_WITHIN. Killing first would race asyncio's
    child watcher: `Popen.send_signal` polls, which reaps an exited child in this thread, and
    the watcher, waiting on that pid in its own, then logs "Unknown child process" and loses
    the exit status (seen whenever tmux died)."""
    try:
        await asyncio.wait_for(asyncio.shield(proc.wait()), ENDS_WITHIN)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


class PaneActivity:
    """Calls `on_output(monotonic time)` whenever the pane writes (at most once per SAMPLE)."""

    def __init__(self, tmux: Tmux, on_output: Callable[[float], None]) -> None:
        self.tmux = tmux
        self.on_output = on_output
        self.last_output: float | None = None  # time.monotonic()
        self._proc: asyncio.subprocess.Process | None = None
        self._paused: set[bytes] = set()
        self._stop = False
        self._wake = asyncio.Event()

    def client_argv(self) -> list[str]:
        attach = ("attach-session", "-f", "ignore-size", "-t", TMUX_SESSION)
        return self.tmux.client_argv("-C", *attach)

    def stop_orphans(self, init: int) -> int:
        """Kill the control clients a dead supervisor left on our socket (orphans re-parent to
        `init`): one that lingers keeps its server from exiting at shutdown (a control client
        waits for its input to close, and nobody holds it any more). How many there were."""
        argv = self.client_argv()
        found = 0
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(init).children():
                with contextlib.suppress(psutil.Error):
                    # psutil checks the create time first: a recycled pid is never signalled.
                    if child.cmdline()[1:] == argv[1:]:
                        child.kill()
                        found += 1
        return found

    def attach(self) -> None:
        """A session with the CLI exists (again): attach now if not attached."""
        if self._proc is None:
            self._wake.set()

    async def run(self) -> None:
        """Attach when told a session exists, follow it until it ends (a heal or a resleeve's
        new server), then wait to be told again; until stop. No polling while detached."""
        while not self._stop:
            await self._wake.wait()
            self._wake.clear()
            if self._stop:
                return
            # Never on its own initiative: a client connecting while the supervisor makes a new
            # server can make tmux 3.3a's new server exit ("server exited unexpectedly"). The
            # supervisor says when a session exists (`attach`), after every fresh start.
            try:
                await self._follow()
            except OSError as exc:
                log.debug("activity client: %s", exc)

    async def _follow(self) -> None:
        # A client of the session's own kind (with SIDECAR_USER: as the CLI's user, never as
        # root, whom the user's server could make run commands).
        proc = await asyncio.create_subprocess_exec(
            *self.client_argv(),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            **self.tmux.client_kwargs(),
        )
        self._proc = proc
        self._paused.clear()
        assert proc.stdout is not None
        tail = b""
        try:
            while chunk := await proc.stdout.read(1 << 16):
                data, tail = tail + chunk, b""
                panes = set(OUTPUT_RE.findall(data))
                if panes:
                    self._seen(panes)
                # A line cut at the chunk's end is looked at again with the next chunk.
                cut = data.rfind(b"\n")
                tail = data[cut:][-64:] if cut >= 0 else data[-64:]
        finally:
            self._proc = None
            await _reap(proc)

    def _seen(self, panes: set[bytes]) -> None:
        now = time.monotonic()
        self.last_output = now
        fresh = panes - self._paused
        if fresh:
            # Pause this client's copy of the pane's output; continue it SAMPLE s later.
            self._command(b"".join(b"refresh-client -A " + p + b":pause\n" for p in fresh))
            self._paused |= fresh
            asyncio.get_running_loop().call_later(SAMPLE, self._resume, fresh)
        self.on_output(now)

    def _resume(self, panes: set[bytes]) -> None:
        self._paused -= panes
        self._command(b"".join(b"refresh-client -A " + p + b":continue\n" for p in panes))

    def _command(self, line: bytes) -> None:
        proc = self._proc
        if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.write(line)

    def quiet_for(self) -> float:
        """Seconds since the pane last wrote (infinity: not since the sidecar started)."""
        if self.last_output is None:
            return float("inf")
        return time.monotonic() - self.last_output

    async def stop(self) -> None:
        self._stop = True
        self._wake.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            # Gone before the supervisor is: shutdown leaves nothing for PID 1's exit to kill.
            await proc.wait()
