"""The sidecar's one tmux control-mode client (`tmux -C attach`), its channel to the CLI's pane:
an `%output` line tells when the pane writes (one wakeup per burst, nothing while it is quiet;
why not the tty's mtime or `capture-pane`: docs/benchmarks.md), `ask` sends commands through
it and reads their replies, with no process per command (how `sidecar.pane.screen` looks), and
while a `sink` is set it hands over every byte the CLI's pane writes (the recorder's tap).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol

import psutil

from sidecar.core.contract import TMUX_SESSION
from sidecar.pane.protocol import ControlError, ControlReader, NoAnswer, NotAttached, Reply
from sidecar.pane.screen import Screen, look_styled
from sidecar.pane.tmux import PANE, Tmux

log = logging.getLogger(__name__)

# On the first `%output` the client pauses the pane for itself (`refresh-client -A %N:pause`:
# tmux keeps reading the pane and drops only this client's copy) and continues it SAMPLE seconds
# later: output is known to within SAMPLE, what the `activity` source and POST /input's hold need.
# With a sink every byte is needed: the pane is never paused, and `on_output` is called at most
# once per SAMPLE instead (and once more at the end of a window in which the pane wrote).
SAMPLE = 0.25  # seconds the pane stays paused for this client after output
# tmux makes a pane wait for a control client that has not yet read what it was sent (its
# `pause-after` aside): a flood of output through an unpaused client runs at the client's pace
# (measured with tmux 3.5a: a client that only copied it to /dev/null made 10 MB take 3.5 s
# instead of 1 s), and a paused pane it does not make wait. So with a sink, a pane that writes
# more than FLOOD bytes within SAMPLE is paused for this client for FLOOD_PAUSE, and the sink
# gets the screen as it is before the pane is continued: a flood is known a frame a second.
FLOOD = 256 * 1024
FLOOD_PAUSE = 1.0
# With a sink, the client's output is read at most once per TAP_BATCH while the pane writes:
# tmux hands it over in pieces of a few hundred bytes, and a wakeup per piece cost the
# supervisor ~20x what the bytes themselves do. The pipe holds 64 KiB: under the FLOOD rate it
# never fills in that time, so the pane never waits for it.
TAP_BATCH = 0.02
# tmux up to 3.6a keeps a control client's offset into a pane's output across `respawn-pane`
# (tmux GitHub issue 5499, fixed after 3.6a; scripts/build-tmux patches it, other builds do
# not): a client that has not read all of it when the pane is respawned makes the server read
# the new process's output at a wrong offset, and the server dies (SIGSEGV, or exit 1 after
# "not enough data"). Measured with 3.5a: 40 respawns of a pane flooding output under a tapped
# client killed its server in 5 runs of 5 (tests/test_pane_activity.py without the pause). So
# this client's copy of the pane is paused around a respawn (`paused`): a paused pane's offset
# holds nothing, and continuing it starts from the pane's own. The respawn waits for tmux's
# reply to the pause, the sign it took effect, up to PAUSE_WITHIN seconds (a pane's torture
# keeps tmux busy past 1 s), then goes ahead.
PAUSE_WITHIN = 5.0
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


class Tap(Protocol):
    """What takes the CLI's pane's bytes (`PaneActivity.tap`)."""

    def wrote(self, data: bytes) -> None:
        """What the pane wrote, unescaped, as it came. Called in the reader's loop: it must
        return at once (a client that falls behind makes the pane wait)."""

    def skipped(self, screen: Screen | None, *, first: bool) -> None:
        """The pane wrote too fast and was paused for a while (`first`: a new flood): the
        screen as it is now, before its bytes come again (None: tmux did not show it)."""


def _pane_action(pane: str, action: str) -> str:
    # Quoted: tmux 3.3a's command parser takes a word that starts with `%` for a directive
    # (`%if`), so `refresh-client -A %3:pause` is a syntax error and pauses nothing.
    return f"refresh-client -A '{pane}:{action}'"


def _lines(commands: Iterable[str]) -> bytes:
    return "".join(f"{command}\n" for command in commands).encode()


class PaneActivity:
    """Calls `on_output(monotonic time)` whenever the pane writes (at most once per SAMPLE, but
    for every output while `closely` says so), and answers `ask` while attached."""

    def __init__(
        self,
        tmux: Tmux,
        on_output: Callable[[float], None],
        on_attach: Callable[[], None] | None = None,
        closely: Callable[[], bool] = lambda: False,
    ) -> None:
        self.tmux = tmux
        self.on_output = on_output
        self.on_attach = on_attach  # the client attached: the screen may be looked at
        # The client went away without being told to (tmux let it go: its server ended, or
        # someone ran `detach-client`), or could not be started: whoever owns the session says
        # whether to attach again (`attach`).
        self.on_detach: Callable[[], None] | None = None
        # Whether every output counts now (a prompt for a person is up: its answer shows as a
        # redraw, which a pause or a SAMPLE window would let pass unnoticed until the next).
        self.closely = closely
        self.last_output: float | None = None  # time.monotonic()
        self._proc: asyncio.subprocess.Process | None = None
        self._paused: set[bytes] = set()
        # One entry per command line sent, in order: tmux answers each line with one reply, in
        # the order it read them. None: a reply nobody waits for (pause, continue). A future's
        # None result: the client went away before the reply came.
        self._waiting: deque[asyncio.Future[Reply | None] | None] = deque()
        self._stop = False
        self._wake = asyncio.Event()
        self.sink: Tap | None = None  # takes every byte of the CLI's pane (None: nobody)
        self._window_ends = 0.0  # with a sink: on_output's next call is due after this
        self._trailing: asyncio.TimerHandle | None = None
        # With a sink: the pane's bytes in the current SAMPLE window, the window's end, whether
        # the pane is paused for a flood, and when the last flood pause ended.
        self._tapped, self._tap_until = 0, 0.0
        self._flooding = False
        self._flood_ended = 0.0
        self._floods: set[asyncio.Task[None]] = set()
        self._holds = 0  # `paused` blocks under way: nothing continues the pane meanwhile

    def client_argv(self) -> list[str]:
        attach = ("attach-session", "-f", "ignore-size", "-t", TMUX_SESSION)
        # -u: a UTF-8 client whatever the locale (with SIDECAR_USER, the user's environment may
        # have none): tmux 3.3a replaces every non-ASCII character of a command's printed
        # output (display-message -p) with `_` for a client it thinks is not UTF-8.
        return self.tmux.client_argv("-u", "-C", *attach)

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
            if not self._stop and self.on_detach is not None:
                self.on_detach()

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
        self._flooding = False
        waiting: deque[asyncio.Future[Reply | None] | None] = deque()
        self._waiting = waiting
        if self.on_attach is not None:
            self.on_attach()
        assert proc.stdout is not None
        reader = ControlReader()
        pane = PANE.encode()
        try:
            while chunk := await proc.stdout.read(1 << 16):
                sink = self.sink
                panes, replies, wrote = reader.feed(chunk, pane if sink is not None else None)
                if wrote and sink is not None:
                    sink.wrote(wrote)
                    self._count(len(wrote))
                if panes:
                    self._seen(panes)
                for reply in replies:
                    if reply.ours and waiting:
                        self._answer(waiting.popleft(), reply)
                if wrote and sink is not None and not self._flooding and not self.closely():
                    await self._gather(proc)  # not while a prompt is up: its answer is awaited
        finally:
            self._proc = None
            while waiting:
                self._answer(waiting.popleft(), None)
            await _reap(proc)

    @staticmethod
    async def _gather(proc: asyncio.subprocess.Process) -> None:
        """Leave the client's output in its pipe for TAP_BATCH (reading paused: no wakeup for
        each piece that arrives meanwhile), then take it all at once."""
        # The Process keeps its SubprocessTransport in `_transport`; what is used of it,
        # get_pipe_transport and pause_reading, is asyncio's public transport API.
        transport = proc._transport  # type: ignore[attr-defined]
        pipe = transport.get_pipe_transport(1) if transport is not None else None
        if pipe is None:
            return
        pipe.pause_reading()
        try:
            await asyncio.sleep(TAP_BATCH)  # sleep-ok: lets the pane's pieces gather in the pipe
        finally:
            if not pipe.is_closing():
                pipe.resume_reading()

    @staticmethod
    def _answer(future: asyncio.Future[Reply | None] | None, reply: Reply | None) -> None:
        if future is not None and not future.done():  # done: its asker timed out
            future.set_result(reply)

    async def ask(self, commands: Sequence[str], timeout: float) -> list[Reply]:
        """Send tmux `commands` (one per line, in one write, so tmux runs them back to back)
        through the control client and return their replies in order. NotAttached: no client
        (or it went away meanwhile); NoAnswer: no reply within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[Reply | None]] = [loop.create_future() for _ in commands]
        if not self._send(_lines(commands), futures):
            msg = "the tmux control client is not attached"
            raise NotAttached(msg)
        try:
            async with asyncio.timeout(timeout):
                replies = [await future for future in futures]
        except TimeoutError:
            msg = f"tmux did not answer within {timeout:g} s"
            raise NoAnswer(msg) from None
        if any(reply is None for reply in replies):
            msg = "the tmux control client went away before tmux answered"
            raise NotAttached(msg)
        return [reply for reply in replies if reply is not None]

    def _seen(self, panes: set[bytes]) -> None:
        now = time.monotonic()
        self.last_output = now
        if self.closely():
            self.on_output(now)
            return
        if self.sink is not None:
            self._seen_unpaused(now)
            return
        fresh = panes - self._paused
        if fresh:
            # Pause this client's copy of the pane's output; continue it SAMPLE s later.
            pauses = (_pane_action(p.decode(), "pause") for p in fresh)
            self._send(_lines(pauses), [None] * len(fresh))
            self._paused |= fresh
            asyncio.get_running_loop().call_later(SAMPLE, self._resume, fresh)
        self.on_output(now)

    def tap(self, sink: Tap | None) -> None:
        """Hand every byte the CLI's pane writes to `sink` from now on (None: stop). A pane
        paused for this client is continued at once: its bytes are wanted."""
        self.sink = sink
        if sink is not None and self._paused:
            self._resume(set(self._paused))

    def _count(self, size: int) -> None:
        """Bytes of the tapped pane: past FLOOD within SAMPLE it is paused for FLOOD_PAUSE."""
        now = time.monotonic()
        if now >= self._tap_until:
            self._tapped, self._tap_until = 0, now + SAMPLE
        self._tapped += size
        if self._tapped <= FLOOD or self._flooding:
            return
        self._flooding = True
        first = now - self._flood_ended > 2 * SAMPLE
        self._send(_lines([_pane_action(PANE, "pause")]), [None])
        loop = asyncio.get_running_loop()
        loop.call_later(FLOOD_PAUSE, self._flood_pause_ends, first)

    def _flood_pause_ends(self, first: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._continue_flooded(first))
        self._floods.add(task)
        task.add_done_callback(self._floods.discard)

    async def _continue_flooded(self, first: bool) -> None:
        """The screen for the sink, then the pane continued."""
        await self._frame(first=first)
        self._flooding = False
        self._flood_ended = time.monotonic()
        self._tapped, self._tap_until = 0, self._flood_ended + SAMPLE
        self._continue([PANE])

    async def _frame(self, *, first: bool) -> None:
        """The screen for the sink, looked at while the pane is still paused (so that no byte
        of it can come before the frame)."""
        if self.sink is None:
            return
        screen = None
        with contextlib.suppress(ControlError):
            screen = await look_styled(self.ask)
        if self.sink is not None:
            self.sink.skipped(screen, first=first)

    @contextlib.asynccontextmanager
    async def paused(self) -> AsyncIterator[None]:
        """This client's copy of the pane paused for the block (a respawn: see PAUSE_WITHIN),
        then continued, a sink first getting the screen as it is. Without a client, nothing
        to pause."""
        self._holds += 1
        try:
            with contextlib.suppress(ControlError):
                await self.ask([_pane_action(PANE, "pause")], PAUSE_WITHIN)
            yield
        finally:
            self._holds -= 1
            if not self._holds and PANE.encode() not in self._paused and not self._flooding:
                await self._frame(first=False)
                self._continue([PANE])

    def _seen_unpaused(self, now: float) -> None:
        """Output while a sink takes every byte: `on_output` at most once per SAMPLE, as the
        pause would allow, and at the end of a window in which the pane went on writing."""
        if now >= self._window_ends:
            self._window_ends = now + SAMPLE
            self.on_output(now)
        elif self._trailing is None:
            delay = self._window_ends - now
            self._trailing = asyncio.get_running_loop().call_later(delay, self._window_end)

    def _window_end(self) -> None:
        self._trailing = None
        last = self.last_output
        if last is not None:
            self._window_ends = time.monotonic() + SAMPLE
            self.on_output(last)

    def _resume(self, panes: set[bytes]) -> None:
        panes &= self._paused  # a tap may have continued them already
        self._paused -= panes
        self._continue(p.decode() for p in panes)

    def _continue(self, panes: Iterable[str]) -> None:
        """Continue this client's copy of `panes`, unless a `paused` block is under way (its
        end continues them)."""
        actions = [_pane_action(p, "continue") for p in panes]
        if actions and not self._holds:
            self._send(_lines(actions), [None] * len(actions))

    def _send(self, lines: bytes, replies: Sequence[asyncio.Future[Reply | None] | None]) -> bool:
        """Write command `lines` to the client, one entry in `replies` per line (never an empty
        line: that detaches a control client). Whether there was a client to write to."""
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            return False
        proc.stdin.write(lines)
        self._waiting.extend(replies)
        return True

    def quiet_for(self) -> float:
        """Seconds since the pane last wrote (infinity: not since the sidecar started)."""
        if self.last_output is None:
            return float("inf")
        return time.monotonic() - self.last_output

    async def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._trailing is not None:
            self._trailing.cancel()
        for task in list(self._floods):
            task.cancel()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            # Gone before the supervisor is: shutdown leaves nothing for PID 1's exit to kill.
            await proc.wait()
