"""Keystroke echo: type a unique marker into the shell pane and wait for it to come back,
through the sidecar's `/terminal/ws` proxy and through ttyd's own socket, alternately.

ttyd's protocol (subprotocol `tty`): the client's first message is JSON
`{"AuthToken", "columns", "rows"}`; then binary frames whose first byte is a command: client
`0`+input, server `0`+output.

ttyd listens on a unix socket in the state dir (the default); the direct baseline connects to
it as the proxy does, with the writer's tmux attach flags as ttyd's URL argument.

Two clients type into one shell, in turn. A round first clears the line (Ctrl-U, then an untimed
marker, in one frame, until that marker echoes), then times one marker typed alone. Either way a
client's last keys are a marker whose echo it has seen: nothing it typed is still on its way to
the shell when the other client types. (A Ctrl-U sent after the timed marker, unwaited for, was:
tmux queues each client's keys separately, so the proxied client's next marker could reach the
shell before the direct client's Ctrl-U sent earlier, which then wiped it out unechoed: the
keystroke "lost" in about one short run in eight.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from pathlib import Path

import aiohttp

from bench.context import Context
from bench.core import Baseline, Figure, at_most, ratio_at_most
from bench.procs import BenchError, running
from sidecar.process.ttyd import WRITER_FLAGS

NAMES = ("terminal.echo", "terminal.lost")
TIMEOUT = 10.0
ROUND_TIMEOUT = 3.0  # a marker not echoed by then counts as a lost keystroke
MAX_LOST = 3
KILL_LINE = b"\x15"  # Ctrl-U: readline clears the line
# Escape sequences: CSI, OSC, and two-byte ones (as tests/e2e/ttyclient.py strips them).
_ESCAPES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_()][0-9A-Za-z]?"
)


class Term:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.output = bytearray()
        self.changed = asyncio.Event()
        self.reader = asyncio.create_task(self._read())
        self.last_lost = b""

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"0":
                self.output += msg.data[1:]
                if len(self.output) > 1 << 20:
                    del self.output[: len(self.output) - (1 << 16)]
                self.changed.set()

    def seen(self, needle: bytes, since: int) -> bool:
        """`needle` in the output since byte `since`: as sent, or with the escape sequences
        taken out (a terminal may redraw a line with cursor moves in the middle)."""
        recent = bytes(self.output[max(0, since - len(needle)) :])
        return needle in recent or needle in _ESCAPES.sub(b"", recent)

    async def wait_for(self, needle: bytes, since: int, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not self.seen(needle, since):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                tail = bytes(self.output[-300:])
                msg = f"{needle!r} not echoed within {timeout}s; last output: {tail!r}"
                raise BenchError(msg)
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                continue

    async def typed(self, keys: bytes, marker: bytes, timeout: float) -> float | None:
        """Type `keys`; seconds until `marker` is in the output, None if not within `timeout`
        (what came meanwhile is kept in `last_lost`)."""
        since = len(self.output)
        start = time.perf_counter()
        await self.ws.send_bytes(b"0" + keys)
        try:
            await self.wait_for(marker, since, timeout)
        except BenchError:
            self.last_lost = bytes(self.output[since:])[-400:]
            return None
        return time.perf_counter() - start

    async def cleared(self, marker: bytes, timeout: float) -> bool:
        """Ctrl-U (readline clears the line, so the prompt stays short) and `marker`, in one
        frame: once the marker echoes, the Ctrl-U and every key before it have been read."""
        return await self.typed(KILL_LINE + marker, marker, timeout) is not None

    async def drawn(self) -> None:
        """Until the terminal's first output. ttyd starts `tmux attach` on the init message,
        and tmux draws only once it has made the pty raw; keys typed before that are the
        kernel line discipline's, which echoes them itself (a false echo) and takes Ctrl-U as
        its own. A terminal on a screen starts typing after it has drawn, too."""
        deadline = time.monotonic() + TIMEOUT
        while not self.output:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                msg = f"no output within {TIMEOUT}s of the init message"
                raise BenchError(msg)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

    async def ready(self, streak: int = 3, tries: int = 15) -> None:
        """Until `streak` typed markers in a row echo. Start-up is not what is measured: a
        login shell reading its profile may swallow input, and a tmux client that has just
        attached (ttyd starts one per connection) redraws the screen meanwhile."""
        good = 0
        for n in range(tries):
            marker = f"r{n}{secrets.token_hex(4)}q".encode()
            good = good + 1 if await self.cleared(marker, 2.0) else 0
            if good >= streak:
                return
        msg = f"the shell did not echo {streak} markers in a row ({tries} tries)"
        raise BenchError(msg)

    async def echo(self, marker: str) -> float | None:
        """Milliseconds from typing `marker` (on a line just cleared) to seeing it in the
        output; None if it, or the clearing, never came back."""
        if not await self.cleared(f"c{secrets.token_hex(4)}q".encode(), ROUND_TIMEOUT):
            return None
        took = await self.typed(marker.encode(), marker.encode(), ROUND_TIMEOUT)
        return None if took is None else took * 1000


async def _connect(session: aiohttp.ClientSession, url: str) -> Term:
    ws = await session.ws_connect(url, protocols=("tty",), max_msg_size=1 << 22)
    if ws.protocol != "tty":
        msg = f"{url} did not accept the tty subprotocol"
        raise BenchError(msg)
    await ws.send_str(json.dumps({"AuthToken": "", "columns": 200, "rows": 50}))
    term = Term(ws)
    await term.drawn()
    return term  # the warm-up rounds wait for the shell's first prompt


async def _measure(
    port: int, ttyd_socket: Path, rounds: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    urls = {
        "proxy": f"ws://127.0.0.1:{port}/terminal/ws",
        "direct": f"http://localhost/terminal/ws?arg={WRITER_FLAGS}",
    }
    out: dict[str, list[float]] = {name: [] for name in urls}
    lost: dict[str, list[str]] = {name: [] for name in urls}
    unix = aiohttp.UnixConnector(path=str(ttyd_socket))
    async with aiohttp.ClientSession() as session, aiohttp.ClientSession(connector=unix) as direct:
        terms = {
            "proxy": await _connect(session, urls["proxy"]),
            "direct": await _connect(direct, urls["direct"]),
        }
        try:
            for _ in range(2):  # twice: the second client's attach can disturb the first
                for term in terms.values():
                    await term.ready()
            for n in range(warmup + rounds):
                for name, term in terms.items():
                    while (
                        took := await term.echo(f"k{n}{name[0]}{secrets.token_hex(4)}q")
                    ) is None:
                        # A keystroke that never came back: counted and shown, then typed again.
                        lost[name].append(repr(term.last_lost))
                        if sum(map(len, lost.values())) > MAX_LOST:
                            msg = f"more than {MAX_LOST} keystrokes lost: {lost}"
                            raise BenchError(msg)
                    if n >= warmup:
                        out[name].append(took)
        finally:
            for term in terms.values():
                await term.ws.close()
                term.reader.cancel()
    return out, lost


def run(ctx: Context) -> list[Figure]:
    with running(ctx.scratch("te")) as sc:
        got, lost = asyncio.run(
            _measure(sc.port, sc.state_dir / "ttyd.sock", ctx.pick(5, 40), ctx.pick(2, 5))
        )
    return [
        Figure(
            "terminal.echo",
            "terminal: keystroke echo via /terminal/ws",
            "ms",
            got["proxy"],
            Baseline("ttyd directly", got["direct"]),
            ratio_at_most(1.5, "≤1.5× ttyd direct"),
        ),
        Figure(
            "terminal.lost",
            f"terminal: keystrokes not echoed within {ROUND_TIMEOUT:g} s (via /terminal/ws)",
            "",
            [float(len(lost["proxy"]))],
            Baseline("ttyd directly", [float(len(lost["direct"]))]),
            at_most(0, "0"),
            extra={"lost_output_tails": lost},
        ),
    ]
