"""The pane-output torture test: a CLI writes adversarial terminal output as fast as the pane takes
it (tests/clis/torture.py: every escape-sequence family, invalid UTF-8, wide and combining
characters) while the sidecar's control client is attached, /screen is read in a loop, /status
is asked in a loop, the web terminal is attached and resized, and the window is resized. The
tmux server must not die (tmux 3.3a's did, in its handling of pane output), the sidecar must log
no error and /status must answer throughout. Two thirds in, the test SIGKILLs the tmux server:
it is healed, and counted as a kill (`sidecar_tmux_server_deaths_total{signal="SIGKILL"}`),
not a crash, and the torture goes on in the new server.

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

import aiohttp
import pytest

from tests.harness import CLIS, Sidecar, http, wait_for, write_cli_config
from tests.test_faults import census, explained
from tests.test_metrics import TOKEN, scrape, value

SECONDS = float(os.environ.get("TORTURE_SECONDS") or 30)  # the torture's length; ≤ 60 s in CI
pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(120, SECONDS + 90))]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HEAL_WITHIN = 15.0  # seconds a SIGKILLed server has to be replaced, under the torture's load


@dataclass
class Tally:
    """What the loops saw: answers by code, the slowest /status, the terminal's bytes."""

    screens: dict[int | str, int] = field(default_factory=dict)
    statuses: dict[int | str, int] = field(default_factory=dict)
    slowest_status: float = 0.0
    terminal_bytes: int = 0
    terminal_attaches: int = 0
    resizes: int = 0
    resleeves: dict[int | str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def count(where: dict[int | str, int], key: int | str) -> None:
    where[key] = where.get(key, 0) + 1


def read_screens(sc: Sidecar, tally: Tally, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            code, body = http("GET", sc.url + "/screen", headers=AUTH, timeout=10)
        except OSError as exc:
            count(tally.screens, type(exc).__name__)
            tally.problems.append(f"/screen: {exc!r}")
            continue
        count(tally.screens, code)
        # 503: tmux could not be asked right now (busy past 1 s, or being replaced), as the
        # contract allows; nothing else but 200
        if code not in (200, 503):
            tally.problems.append(f"/screen answered {code}: {body}")


def ask_status(sc: Sidecar, tally: Tally, stop: threading.Event) -> None:
    while not stop.is_set():
        began = time.monotonic()
        try:
            code, body = http("GET", sc.url + "/status", headers=AUTH, timeout=10)
        except OSError as exc:
            count(tally.statuses, type(exc).__name__)
            tally.problems.append(f"/status: {exc!r}")
            continue
        tally.slowest_status = max(tally.slowest_status, time.monotonic() - began)
        count(tally.statuses, code)
        if code != 200:
            tally.problems.append(f"/status answered {code}: {body}")
        stop.wait(0.05)


def resleeve(sc: Sidecar, tally: Tally, stop: threading.Event) -> None:
    """A resleeve to the same CLI every few seconds: the pane respawned in the same tmux server
    while output pours out of it (tmux 3.3a kept stale offsets into the pane's buffer across a
    respawn, and crashed reading past its end)."""
    while not stop.wait(3.0):
        try:
            code, body = http("POST", sc.url + "/resleeve", {"cli": "torture"}, headers=AUTH)
        except OSError as exc:
            tally.problems.append(f"/resleeve: {exc!r}")
            continue
        count(tally.resleeves, code)
        if code not in (202, 409):  # 409: one still under way (or the heal's)
            tally.problems.append(f"/resleeve answered {code}: {body}")


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
    loops = [
        threading.Thread(target=read_screens, args=(sc, tally, stop)),
        threading.Thread(target=ask_status, args=(sc, tally, stop)),
        threading.Thread(target=resleeve, args=(sc, tally, stop)),
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
            second = wait_for(
                lambda: new_server(sc, first.pid),
                timeout=HEAL_WITHIN,
                what=f"a new tmux server after the SIGKILL; {replay}",
            )
            sc.wait_status(
                lambda s: s["cli_running"], f"the CLI running again; {replay}", timeout=HEAL_WITHIN
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
        screens = sum(tally.screens.values())
        assert tally.screens.get(200, 0) >= max(10, screens // 2), (tally.screens, replay)
        assert tally.statuses.get(200, 0) >= 20 and tally.slowest_status < 5, (tally, replay)
        assert tally.resleeves.get(202, 0) >= 3, (tally.resleeves, replay)
        assert tally.terminal_attaches >= 2 and tally.terminal_bytes > 1_000_000, (tally, replay)
        print(
            f"torture {seed}: {SECONDS:g} s, /screen {tally.screens}, /status {tally.statuses} "
            f"(slowest {tally.slowest_status:.2f} s), resleeves {tally.resleeves}, terminal "
            f"{tally.terminal_bytes} bytes in {tally.terminal_attaches} attaches, "
            f"{tally.resizes} window resizes"
        )
