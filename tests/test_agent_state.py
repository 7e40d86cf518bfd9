"""Agent state from pane activity (the `shell` CLI and custom ones), `POST /input` and its bad
input, and inbox notices: real sidecar processes with real tmux on private sockets."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agenttools import EventLog, wait_agent, wait_ticks
from tests.commands import sidecar_cmd
from tests.harness import CLIS, Sidecar, wait_for, write_cli_config

TOKEN = "agent-state-admin-0123456789"
VIEW = "agent-state-view-0123456789"


def prompt_cli(tmp: Path, **extra: Any) -> tuple[Path, Path]:
    """A registry with `pcli` (tests/clis/prompt_cli.py) and the file its input is logged to."""
    log = tmp / "typed.txt"
    entry = {"command": [sys.executable, str(CLIS / "prompt_cli.py"), str(log)], **extra}
    config = write_cli_config(tmp / "clis.yaml", {"pcli": entry, "quiet": {
        "command": ["sleep", "600"], "state": "none"}})  # fmt: skip
    return config, log


def quick_idle(config: Path) -> dict[str, str]:
    """The registry, and the shortest quiet period that counts as idle (the default is 3 s):
    for tests that only need the agent to settle before they type."""
    return {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "0.5"}


def test_shell_goes_working_with_output_and_idle_when_quiet_then_exited(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_ACTIVITY_QUIET": "1"}).start()
    events = EventLog(sc)
    first = wait_agent(sc, "idle")
    assert first["source"] == "activity" and first["session_id"] is None
    code, body = sc.post("/input", {"text": "for i in 1 2 3 4; do echo tick-$i; sleep 0.4; done"})
    assert code == 202 and body["delivered"], body
    wait_agent(sc, "working")
    # Output every 0.4 s keeps it working; 1 s of quiet after the loop makes it idle.
    idle = wait_agent(sc, "idle")
    working = [e for e in events.of("agent-state") if e["previous"] == "working"]
    assert working and working[0]["state"] == "idle"
    assert idle["reason"] is None
    code, body = sc.post("/input", {"text": "exit"})
    assert code == 202, body
    wait_agent(sc, "exited")
    events.wait(lambda e: e.get("state") == "exited", "the exited event")
    # (Typing `exit` may or may not show as `working` before the shell is gone: not asked.)
    events.wait_states(["idle", "working", "idle", "exited"])
    assert sc.get("/health")[1]["agent"] == "exited"
    # Nothing can be typed into a CLI that is not running.
    code, body = sc.post("/input", {"text": "hello"})
    assert code == 409 and "not running" in body["error"]
    code, body = sc.post("/input", {"keys": ["Enter"]})
    assert code == 409


def test_custom_cli_by_activity_and_one_that_gives_no_signal_is_unknown(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    config, typed = prompt_cli(short_tmp)
    sc = make_sidecar(
        cli="pcli", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "1"}
    ).start()
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "work 2"})[0] == 202
    working = wait_agent(sc, "working")
    assert working["source"] == "activity"
    wait_agent(sc, "idle", timeout=10)
    assert "work 2\n" in typed.read_text()
    code, body = sc.post("/resleeve", {"cli": "quiet"})
    assert code == 202, body
    sc.wait_status(lambda s: s["cli"] == "quiet" and s["cli_running"], "quiet running")
    unknown = wait_agent(sc, "unknown")
    assert unknown["source"] == "none"


def test_input_types_text_literally_and_named_keys(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """Shell syntax, tmux separators and quotes arrive as typed; nothing is interpreted."""
    config, typed = prompt_cli(short_tmp)
    sc = make_sidecar(cli="pcli", env_extra=quick_idle(config)).start()
    wait_agent(sc, "idle")
    text = "a ; kill-server \\; $(touch pwned) `id` 'q' \"d\" ünï"
    assert sc.post("/input", {"text": text})[0] == 202
    assert sc.post("/input", {"text": "no enter", "submit": False})[0] == 202
    assert sc.post("/input", {"keys": ["Space", "y", "7", "Enter"]})[0] == 202
    wait_for(lambda: "no enter y7\n" in typed.read_text(), 10, what="keys typed")
    assert typed.read_text().splitlines()[:2] == [text, "no enter y7"]
    assert not (sc.workspace / "pwned").exists()
    assert sc.status()["cli_running"]


def test_a_busy_cli_gets_its_enter_after_it_has_drawn_the_text(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """tests/clis/busy_cli.py reads its input only every 0.6 s, as Gemini CLI does when it is
    busy, and takes an Enter it reads with the text as a newline: /input's Enter comes once the
    CLI has drawn the text, so both prompts are submitted. (With a fixed 0.3 s pause after the
    paste, the CLI read text and Enter at once, a newline.) The same text twice: the second
    Enter waits for the second echo, not the first one still on the screen."""
    log = short_tmp / "busy.txt"
    entry = {"command": [sys.executable, str(CLIS / "busy_cli.py"), str(log)]}
    config = write_cli_config(short_tmp / "clis.yaml", {"busy": entry})
    sc = make_sidecar(cli="busy", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start()
    wait_for(lambda: "busy>" in "".join(sc.get("/screen")[1].get("lines", [])), 15,
             what="the busy CLI's prompt, drawn in raw mode")  # fmt: skip
    for _ in range(2):
        code, body = sc.post("/input", {"text": "run the tests"})
        assert code == 202 and body["delivered"], body
    wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 2, 15,
             what="two lines read by the busy CLI")  # fmt: skip
    assert log.read_text().splitlines() == ["submitted run the tests"] * 2


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"text": "a", "keys": ["Enter"]}, 400, "exactly one"),
        ({}, 400, "exactly one"),
        ({"submit": True}, 400, "exactly one"),
        ({"keys": []}, 400, "length >= 1"),
        ({"keys": ["Enter; kill-server"]}, 400, "Enter; kill-server"),
        ({"keys": ["Enter"], "submit": False}, 400, "submit"),
        ({"text": "x" * (64 * 1024 + 1)}, 400, "65536"),
        ({"text": "é" * (32 * 1024 + 1)}, 400, "bytes"),
        ({"text": "a\x00b"}, 400, "U+0000"),
        ({"text": "a\x1b[201~\x1b[A"}, 400, "U+001B"),
        ({"text": "a\u009b2J"}, 400, "U+009B"),
        ({"text": "a", "if_state": "idle"}, 400, "if_state"),
        ({"text": "a", "if_state": ["sleepy"]}, 400, "sleepy"),
        ({"text": "a", "if_state": ["working", "waiting"]}, 409, "not waiting or working"),
        ({"text": 5}, 400, "text"),
        ({"text": "a", "extra": 1}, 400, "extra"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_typed(
    make_sidecar: Callable[..., Sidecar],
    short_tmp: Path,
    body: dict[str, Any],
    status: int,
    words: str,
) -> None:
    config, typed = prompt_cli(short_tmp)
    sc = make_sidecar(cli="pcli", env_extra=quick_idle(config)).start()
    wait_agent(sc, "idle")
    code, answer = sc.post("/input", body)
    assert code == status, answer
    assert words in answer["error"], answer
    assert sc.post("/input", {"text": "after"})[0] == 202
    wait_for(lambda: typed.exists() and typed.read_text(), 10, what="the next line typed")
    assert typed.read_text() == "after\n"


def test_input_needs_the_admin_token(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}).start()
    code, body = sc.post("/input", {"text": "echo hi"}, headers={})
    assert code == 401, body
    code, body = sc.post("/input", {"text": "echo hi"}, headers={"Authorization": f"Bearer {VIEW}"})
    assert code == 403, body
    assert sc.get("/status", headers={"Authorization": f"Bearer {VIEW}"})[1]["agent"]


def test_inbox_notice_comes_when_idle_exactly_once_also_across_a_restart(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """A message posted while the agent works is announced once it is idle, once; a message
    appended after that gets its own notice; a restarted sidecar announces neither again."""
    config, typed = prompt_cli(short_tmp, prompt=True)
    env = {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "1"}
    sc = make_sidecar(cli="pcli", env_extra=env).start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "work 3"})[0] == 202
    wait_agent(sc, "working")
    code, posted = sc.post(
        "/inbox", {"from": "envoy", "type": "task", "content": "Fix the login bug\nDetails..."}
    )
    assert code == 201, posted
    notified = events.wait(lambda e: e["type"] == "inbox-notified", "inbox-notified", 20)
    # Announced only once the agent was idle again (typing it makes output: working again).
    lines = list(events.lines)
    rested = next(
        i for i, e in enumerate(lines) if e.get("state") == "idle" and e["previous"] == "working"
    )
    assert lines.index(notified) > rested, lines
    assert notified["ids"] == [posted["id"]]
    line = notified["text"]
    assert "envoy" in line and "task" in line and "Fix the login bug" in line
    assert ".needlecast/inbox.md" in line and "Details" not in line
    wait_for(lambda: line in typed.read_text(), 10, what="the notice typed")

    code, second = sc.post("/inbox", {"from": "envoy", "type": "question", "content": "Why?"})
    assert code == 201
    events.wait(
        lambda e: e["type"] == "inbox-notified" and e["ids"] == [second["id"]], "second", 20
    )
    wait_agent(sc, "idle")
    assert len(events.of("inbox-notified")) == 2

    assert sc.stop() == 0
    sc.start()
    again = EventLog(sc)
    wait_agent(sc, "idle")
    # Nothing new: no notice (the tick runs every second; give it a few).
    assert sc.post("/input", {"text": "marker-after-restart"})[0] == 202
    wait_for(lambda: "marker-after-restart" in typed.read_text(), 10, what="marker")
    wait_agent(sc, "idle")
    code, third = sc.post("/inbox", {"from": "ops", "type": "directive", "content": "Stop."})
    notice = again.wait(lambda e: e["type"] == "inbox-notified", "third", 20)
    assert notice["ids"] == [third["id"]]
    assert typed.read_text().count("Fix the login bug") == 1


@pytest.mark.parametrize("case", ["no-prompt", "notify-off"])
def test_no_notice_for_a_cli_without_a_prompt_or_with_notices_off(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, case: str
) -> None:
    # prompt: false is the default for custom CLIs
    config, typed = prompt_cli(short_tmp, prompt=case == "notify-off")
    env = {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "1"}
    if case == "notify-off":
        env["SIDECAR_INBOX_NOTIFY"] = "off"
    sc = make_sidecar(cli="pcli", env_extra=env).start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    assert sc.post("/inbox", {"from": "envoy", "type": "task", "content": "hello"})[0] == 201
    # Two ticks of the loop that would type a notice, after the message: a notice would be typed.
    wait_ticks(sc, events, 2)
    assert sc.post("/input", {"text": "marker"})[0] == 202
    wait_for(lambda: "marker" in typed.read_text(), 10, what="marker")
    assert events.of("inbox-notified") == []
    assert typed.read_text() == "marker\n"


def test_sidecar_input_keys_and_wait_commands(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    config, typed = prompt_cli(short_tmp)
    sc = make_sidecar(cli="pcli", env_extra={**quick_idle(config), "SIDECAR_TOKEN": TOKEN}).start()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return sidecar_cmd(sc, *args, token=TOKEN)

    waited = run("wait", "--state", "idle", "--timeout", "15")
    assert waited.returncode == 0 and waited.stdout.strip() == "idle", waited
    assert run("input", "first line").returncode == 0
    assert run("input", "--no-submit", "second").returncode == 0
    done = run("keys", "Space", "y", "Enter", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["delivered"] is True
    wait_for(lambda: "second y\n" in typed.read_text(), 10, what="typed")
    assert typed.read_text() == "first line\nsecond y\n"
    missed = run("wait", "--state", "exited", "--state", "waiting", "--timeout", "1")
    assert missed.returncode == 1 and "not exited or waiting" in missed.stderr
    bad = run("keys", "Enter; kill-server")
    assert bad.returncode == 2  # argparse: not one of the key names
    status = run("status")
    assert "agent     idle" in status.stdout or "agent     working" in status.stdout
