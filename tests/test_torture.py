"""The pane-output torture test: a CLI writes adversarial terminal output as fast as the pane takes
it (tests/clis/torture.py: every escape-sequence family, invalid UTF-8, wide and combining
characters) while the sidecar's control client is attached, /screen and /status are asked in a
loop, the web terminal is attached and resized, the window is resized and the CLI is resleeved
every 3 s (its pane respawned in the same server while the output pours out). No tmux server may
die but the one the test SIGKILLs two thirds in, which is healed and counted as a kill
(`sidecar_tmux_server_deaths_total{signal="SIGKILL"}`), not a crash, the torture going on in the
new server; the sidecar must log no error and /status must answer throughout.

The stream is the seed's alone: a failure prints the seed, and `TORTURE_SEED=N` replays it
(`TORTURE_SECONDS` runs longer, to hunt). Real parts throughout: tmux, ttyd, the sidecar.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import aiohttp
import pytest

from tests.faulttools import census, explained
from tests.harness import CLIS, Sidecar, http, wait_for, write_cli_config
from tests.metricstools import TOKEN, scrape, value

SECONDS = float(os.environ.get("TORTURE_SECONDS") or 30)  # the torture's length; ≤ 60 s in CI
pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(120, SECONDS + 90))]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HEAL_WITHIN = 15.0  # seconds a SIGKILLed server has to be replaced, under the torture's load


@dataclass
class Tally:
    """What the loops saw: answers by path and code, the slowest of each path, the terminal's
    bytes and attaches, and anything that should not have happened."""

    answers: dict[str, dict[int | str, int]] = field(default_factory=dict)
    slowest: dict[str, float] = field(default_factory=dict)
    terminal_bytes: int = 0
    terminal_attaches: int = 0
    resizes: int = 0
    problems: list[str] = field(default_factory=list)

    def of(self, path: str, code: int | str) -> int:
        return self.answers.get(path, {}).get(code, 0)


class Ask(NamedTuple):
    """A request made in a loop, every `every` seconds; any code but `allowed` is a problem."""

    method: str
    path: str
    body: object
    allowed: tuple[int, ...]
    every: float


def ask_in_a_loop(sc: Sidecar, tally: Tally, stop: threading.Event, ask: Ask) -> None:
    """`ask` until `stop`: each answer counted by code (an error by its name), the slowest
    kept."""
    counts = tally.answers.setdefault(ask.path, {})
    while not stop.wait(ask.every):
        began = time.monotonic()
        try:
            code, answer = http(ask.method, sc.url + ask.path, ask.body, headers=AUTH, timeout=10)
        except OSError as exc:
            code, answer = type(exc).__name__, repr(exc)
        took = time.monotonic() - began
        tally.slowest[ask.path] = max(tally.slowest.get(ask.path, 0.0), took)
        counts[code] = counts.get(code, 0) + 1
        if code not in ask.allowed:
            tally.problems.append(f"{ask.method} {ask.path}: {code} {answer}")


def resize_window(sc: Sidecar, rng: random.Random, tally: Tally, stop: threading.Event) -> None:
    """The window resized now and then, as an operator (or a layout change) would."""
    sock = str(sc.state_dir / "tmux.sock")
    while not stop.wait(0.3):
        width, height = rng.randrange(20, 300), rng.randrange(5, 120)
        subprocess.run(
            [
                "tmux",
                "-S",
                sock,
                "resize-window",
                "-t",
                "main",
                "-x",
                str(width),
                "-y",
                str(height),
            ],
            capture_output=True,
            timeout=10,
            check=False,  # refused while the heal makes a new server: that is fine
        )
        tally.resizes += 1


async def _terminal(sc: Sidecar, rng: random.Random, tally: Tally, stop: threading.Event) -> None:
    """A browser's web terminal: attached (again after the heal), reading everything, resized
    every second (ttyd's `1{"columns", "rows"}` message)."""
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.ws_connect(
                    sc.url + "/terminal/ws", protocols=("tty",), headers=AUTH
                ) as ws:
                    hello = {"AuthToken": "", "columns": 200, "rows": 50}
                    await ws.send_bytes(json.dumps(hello).encode())
                    tally.terminal_attaches += 1
                    resized = time.monotonic()
                    while not stop.is_set():
                        msg = await ws.receive(timeout=0.5)
                        if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED):
                            break
                        if msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"0":
                            tally.terminal_bytes += len(msg.data) - 1
                        if time.monotonic() - resized > 1.0:
                            size = {"columns": rng.randrange(2, 400), "rows": rng.randrange(2, 150)}
                            await ws.send_bytes(b"1" + json.dumps(size).encode())
                            resized = time.monotonic()
            except TimeoutError:
                continue  # no output for half a second: look at `stop` and read on
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)  # sleep-ok: before attaching again (the heal)


def terminal(sc: Sidecar, rng: random.Random, tally: Tally, stop: threading.Event) -> None:
    asyncio.run(_terminal(sc, rng, tally, stop))


@pytest.fixture
def torture(short_tmp: Path) -> Iterator[tuple[Sidecar, int]]:
    seed = int(os.environ.get("TORTURE_SEED") or random.SystemRandom().randrange(1 << 32))
    command = [sys.executable, str(CLIS / "torture.py"), str(seed)]
    clis = write_cli_config(short_tmp / "clis.yaml", {"torture": {"command": command}})
    sc = Sidecar(
        short_tmp,
        cli="torture",
        env_extra={"SIDECAR_CLI_CONFIG": str(clis), "SIDECAR_TOKEN": TOKEN},
    )
    try:
        yield sc.start(), seed
    finally:
        sc.kill_everything()


def errors_logged(sc: Sidecar, expected: Callable[[str], bool]) -> list[str]:
    """The sidecar's error and critical log lines (and any that are not JSON) `expected` refuses."""
    found = []
    for line in sc.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            found.append(line)
            continue
        if entry.get("level") in ("error", "critical") and not expected(entry["msg"]):
            found.append(line)
    return found


def new_server(sc: Sidecar, old: int) -> int | None:
    """The pid of the one tmux server on the sidecar's socket once it is not `old`."""
    servers = [s.pid for s in census(sc).servers]
    return servers[0] if servers and servers != [old] and len(servers) == 1 else None


def test_tmux_and_the_sidecar_hold_under_adversarial_pane_output(
    torture: tuple[Sidecar, int],
) -> None:
    sc, seed = torture
    replay = f"replay: TORTURE_SEED={seed} (tests/clis/torture.py {seed})"
    rng = random.Random(seed)
    tally = Tally()
    stop = threading.Event()
    # /screen: 503 is tmux that could not be asked right now (busy past 1 s, or being replaced),
    # as the contract allows. A resleeve to the same CLI every 3 s respawns the pane in the same
    # server while the output pours out (409: one still under way, or the heal).
    asks = [
        Ask("GET", "/screen", None, (200, 503), 0.0),
        Ask("GET", "/status", None, (200,), 0.05),
        Ask("POST", "/resleeve", {"cli": "torture"}, (202, 409), 3.0),
    ]
    loops = [
        *(threading.Thread(target=ask_in_a_loop, args=(sc, tally, stop, ask)) for ask in asks),
        threading.Thread(target=resize_window, args=(sc, random.Random(rng.random()), tally, stop)),
        threading.Thread(target=terminal, args=(sc, random.Random(rng.random()), tally, stop)),
    ]
    with explained(sc):
        [first] = census(sc).servers
        began = time.monotonic()
        for loop in loops:
            loop.start()
        try:
            stop.wait(SECONDS * 2 / 3)
            assert [s.pid for s in census(sc).servers] == [first.pid], f"tmux died; {replay}"
            attaches = tally.terminal_attaches
            os.kill(first.pid, signal.SIGKILL)
            # The heal, then the server: meanwhile the web terminal's `tmux attach` may start a
            # server of its own on the socket, which finds no session and exits.
            wait_for(
                lambda: scrape(sc).get(("sidecar_tmux_heals_total", ())) == 1,
                timeout=HEAL_WITHIN,
                what=f"the heal after the SIGKILL; {replay}",
            )
            sc.wait_status(
                lambda s: s["cli_running"], f"the CLI running again; {replay}", timeout=HEAL_WITHIN
            )
            second = wait_for(
                lambda: new_server(sc, first.pid),
                timeout=HEAL_WITHIN,
                what=f"the new tmux server after the SIGKILL; {replay}",
            )
            wait_for(
                lambda: tally.terminal_attaches > attaches,
                timeout=HEAL_WITHIN,
                what=lambda: f"the web terminal attached again: {tally}; {replay}",
            )
            stop.wait(max(0.0, began + SECONDS - time.monotonic()))
        finally:
            stop.set()
            for loop in loops:
                loop.join(30)
        assert not tally.problems, f"{tally.problems[:10]}; {replay}"
        assert [s.pid for s in census(sc).servers] == [second], f"tmux died; {replay}"
        assert sc.status()["cli_running"], replay
        deaths = scrape(sc)
        assert value(deaths, "sidecar_tmux_server_deaths_total", signal="SIGKILL") == 1, replay
        for crash in ("SIGSEGV", "SIGABRT"):
            assert value(deaths, "sidecar_tmux_server_deaths_total", signal=crash) == 0, replay
        assert value(deaths, "sidecar_tmux_heals_total") == 1, replay
        killed = f"tmux server {first.pid} was killed (SIGKILL); recreating the session"
        assert errors_logged(sc, lambda msg: msg == killed) == [], replay
        # It was a torture: the loops ran all along, and the terminal got the output.
        screens = sum(tally.answers["/screen"].values())
        assert tally.of("/screen", 200) >= max(10, screens // 2), (tally, replay)
        assert tally.of("/status", 200) >= 20 and tally.slowest["/status"] < 5, (tally, replay)
        assert tally.of("/resleeve", 202) >= 3, (tally, replay)
        assert tally.terminal_attaches >= 2 and tally.terminal_bytes > 1_000_000, (tally, replay)
        print(f"torture {seed}, {SECONDS:g} s: {tally}")
