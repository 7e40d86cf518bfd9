"""The sidecar's tmux control client (`PaneActivity`) on a real pane.

A respawn tmux survives: tmux up to 3.6a dies respawning a pane that a control client has not
read all of (tmux GitHub issue 5499; SIGSEGV, or exit 1 after "not enough data"), and the
sidecar's own client, tapping every byte for the recording, is behind most of the time a pane
floods. The supervisor respawns through `TmuxServer.launch`, which pauses that client's copy of
the pane around the respawn (`PaneActivity.paused`).

Real parts: the suite's tmux on a private socket, the sidecar's control client, a pane flooding
output that each respawn kills (`-k`) mid-flood. With the same loop and no pause, tmux 3.5a's
server died in 5 runs of 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import pytest

from sidecar.core.layout import Layout
from sidecar.pane.control import PaneActivity
from sidecar.pane.screen import Screen
from sidecar.pane.tmux import Tmux
from sidecar.process.tmux_server import TmuxServer

pytestmark = pytest.mark.timeout(90)

FLOOD = [sys.executable, "-c", "import sys\nwhile True: sys.stdout.write('x' * 70000 + '\\n')"]
RESPAWNS = 40


class Sink:
    """The recorder's side of the tap: counts what comes, and the frames between."""

    def __init__(self) -> None:
        self.bytes = 0
        self.frames = 0
        self.flowing = asyncio.Event()

    def wrote(self, data: bytes) -> None:
        self.bytes += len(data)
        self.flowing.set()

    def skipped(self, screen: Screen | None, *, first: bool) -> None:
        self.frames += screen is not None


async def test_respawns_of_a_flooding_pane_under_a_tapped_client_keep_the_server(
    short_tmp: Path,
) -> None:
    tmux = Tmux(Layout(short_tmp))
    sink = Sink()
    activity = PaneActivity(tmux, lambda _: None, lambda: activity.tap(sink))
    server = TmuxServer(tmux, activity.paused)
    follow = asyncio.create_task(activity.run())
    try:
        first = await server.launch(FLOOD, short_tmp, {}, fresh=True)
        activity.attach()
        for n in range(RESPAWNS):
            # Each respawn once the flood reaches the tap again: the client is behind.
            await asyncio.wait_for(sink.flowing.wait(), 10)
            sink.flowing.clear()
            pane = await server.launch(FLOOD, short_tmp, {}, fresh=False)
            assert pane.server_pid == first.server_pid, f"respawn {n}"
            os.kill(first.server_pid, 0)  # ProcessLookupError: the server died
        await asyncio.wait_for(sink.flowing.wait(), 10)  # continued after the last one
        assert sink.frames >= RESPAWNS // 2, sink.frames  # the screen, before each continue
    finally:
        await activity.stop()
        follow.cancel()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(tmux.run_client, ["kill-server"], timeout=10)


async def test_while_a_prompt_is_up_output_right_after_output_is_told(short_tmp: Path) -> None:
    """A pane echoes a first key and prints a question, then echoes the answer typed as soon as
    the first output is told, well within SAMPLE: that second output is told too. Without
    `closely` the client pauses the pane for itself after the first output and tells nothing
    more until the pane writes again after the pause, which this one never does."""
    tmux = Tmux(Layout(short_tmp))
    first, second = asyncio.Event(), asyncio.Event()
    attached = asyncio.Event()

    def output(_: float) -> None:
        (second if first.is_set() else first).set()

    activity = PaneActivity(tmux, output, attached.set, closely=lambda: True)
    server = TmuxServer(tmux, activity.paused)
    follow = asyncio.create_task(activity.run())
    script = "read go; printf 'Proceed? [y/N] '; read answer; echo \"ANSWER $answer\"; sleep 60"
    try:
        await server.launch(["sh", "-c", script], short_tmp, {}, fresh=True)
        activity.attach()
        await asyncio.wait_for(attached.wait(), 10)
        await activity.ask(["display-message -p attached"], 10)  # answered once attached
        await asyncio.to_thread(tmux.run_client, ["send-keys", "-t", "%0", "go", "Enter"])
        await asyncio.wait_for(first.wait(), 10)
        await asyncio.to_thread(tmux.run_client, ["send-keys", "-t", "%0", "y", "Enter"])
        await asyncio.wait_for(second.wait(), 10)
    finally:
        await activity.stop()
        follow.cancel()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(tmux.run_client, ["kill-server"], timeout=10)
