"""A prompt typed at an idle agent is submitted, even when the CLI took the Enter as a newline:
with no submit hook reported, the sidecar sends Enter once more; never when the first one was
taken, never after a line the CLI runs itself.

Gemini CLI takes the Enter after a paste as a newline while its guard after a paste holds (a
40 ms timer that only a starved machine runs late: the real CLI cannot be made to do it on
demand). So the CLI here is a stand-in `gemini` (tests/clis/paste_guard.py) that draws Gemini's
prompt and runs the hooks of the settings file the sidecar gives Gemini, as Gemini does; with
`guard` it takes the first Enter after a paste as a newline, always.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agenttools import EventLog
from tests.harness import CLIS, Sidecar, http, wait_for, write_cli_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def keys(log: Path) -> list[dict[str, Any]]:
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def standin(
    make_sidecar: Callable[..., Sidecar],
    tmp: Path,
    mode: str,
    state: str = "hooks",
    name: str = "gemini",
) -> tuple[Sidecar, Path]:
    """A sidecar running the stand-in as `name` (`gemini`: Gemini CLI's knowledge goes by the
    command's name; with `state: hooks` it gets Gemini's hooks), idle at its prompt; and the
    stand-in's key log."""
    bin_dir, log = tmp / "bin", tmp / "keys.jsonl"
    bin_dir.mkdir()
    command = bin_dir / name
    command.write_text(f"#!/bin/sh\nexec {sys.executable} {CLIS / 'paste_guard.py'} {log} {mode}\n")
    command.chmod(0o755)
    entry = {"command": [str(command)], "state": state}
    config = write_cli_config(tmp / "clis.yaml", {"g": entry})
    sc = make_sidecar(cli="g", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start()
    sc.wait_status(lambda s: s["agent"]["state"] == "idle", "the stand-in idle at its prompt")
    return sc, log


def typed(sc: Sidecar, log: Path, text: str) -> list[dict[str, Any]]:
    """POST /input `text`, then a Tab as a marker: every key the sidecar sent for the text has
    been read by the stand-in once the Tab has (one pty, in order)."""
    assert http("POST", sc.url + "/input", {"text": text}).status == 202
    assert http("POST", sc.url + "/input", {"keys": ["Tab"]}).status == 202
    return wait_for(lambda: (k := keys(log)) and k[-1]["key"] == "tab" and k, 10, what="the Tab")


def test_an_enter_taken_as_a_newline_is_sent_again_and_the_prompt_submitted(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sc, log = standin(make_sidecar, tmp_path, "guard")
    events = EventLog(sc)
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [
        ("newline", "hello there\n"),
        ("submit", "hello there\n"),
        ("tab", ""),
    ]
    assert sc.log().count("no submit hook within") == 1
    events.wait_states(["working", "idle"])


def test_the_second_enter_waits_for_the_prompt_to_be_back(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    # The newline is followed by a hooks line over the prompt for 1.5 s: no Enter is sent
    # while it is up (it would be a newline too), one is sent once the prompt is back.
    sc, log = standin(make_sidecar, tmp_path, "hooks")
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [
        ("newline", "hello there\n"),
        ("submit", "hello there\n"),
        ("tab", ""),
    ]


def test_an_enter_taken_is_not_sent_again(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sc, log = standin(make_sidecar, tmp_path, "plain")
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [("submit", "hello there"), ("tab", "")]
    assert "no submit hook within" not in sc.log()


def test_a_line_the_cli_runs_itself_gets_no_second_enter(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    # A slash command raises no submit hook: a second Enter could pick an item of what it drew.
    sc, log = standin(make_sidecar, tmp_path, "guard")
    got = typed(sc, log, "/help")
    assert [k["key"] for k in got] == ["newline", "tab"]
    assert "no submit hook within" not in sc.log()


# Without hooks (turned off here; Gemini CLI skips a settings file under a directory others can
# write), the screen tells: the prompt still in the input, the cursor on a blank line below it.
RESCUED = "the Enter left the prompt in the CLI's input"


def test_without_hooks_an_enter_taken_as_a_newline_is_sent_again(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sc, log = standin(make_sidecar, tmp_path, "guard", state="activity")
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [
        ("newline", "hello there\n"),
        ("submit", "hello there\n"),
        ("tab", ""),
    ]
    assert sc.log().count(RESCUED) == 1


def test_without_hooks_an_enter_taken_is_not_sent_again(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sc, log = standin(make_sidecar, tmp_path, "plain", state="activity")
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [("submit", "hello there"), ("tab", "")]
    assert RESCUED not in sc.log()


def test_a_cli_whose_screen_is_not_known_gets_no_second_enter(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    # Its screen is read the generic way, which cannot tell its input from a program's output.
    sc, log = standin(make_sidecar, tmp_path, "guard", state="activity", name="standin")
    got = typed(sc, log, "hello there")
    assert [(k["key"], k["text"]) for k in got] == [("newline", "hello there\n"), ("tab", "")]
    assert RESCUED not in sc.log()
