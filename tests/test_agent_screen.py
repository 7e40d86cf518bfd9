"""The agent as the screen shows it, for a CLI without hooks (`activity`): a dialog on screen is
`waiting` (never `idle`), text is not typed into it, answering it brings the CLI back to `idle`,
a pane painted continuously is `working`, and a supervisor started again reads the state off
the screen at once. Real sidecar processes, real tmux, a real CLI (tests/clis/dialog_cli.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.agenttools import EventLog, wait_agent
from tests.harness import CLIS, Sidecar, wait_for, write_cli_config
from tests.proctools import supervisor_of

pytestmark = pytest.mark.slow


def dialog_sidecar(make_sidecar: Callable[..., Sidecar], tmp: Path, **entry: Any) -> Sidecar:
    command = [sys.executable, str(CLIS / "dialog_cli.py"), str(tmp / "typed")]
    config = write_cli_config(tmp / "clis.yaml", {"dlg": {"command": command, **entry}})
    env = {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "0.5"}
    return make_sidecar(cli="dlg", env_extra=env).start()


def type_line(sc: Sidecar, text: str) -> None:
    code, body = sc.post("/input", {"text": text, "if_state": ["idle"]})
    assert code == 202, body


def ready(make_sidecar: Callable[..., Sidecar], tmp: Path, **entry: Any) -> Sidecar:
    """A sidecar whose CLI is at its input prompt, the agent `idle`."""
    sc = dialog_sidecar(make_sidecar, tmp, **entry)
    wait_agent(sc, "idle")
    return sc


def asking(make_sidecar: Callable[..., Sidecar], tmp: Path) -> Sidecar:
    """A sidecar whose CLI shows its yes/no question, the agent `waiting`."""
    sc = ready(make_sidecar, tmp)
    type_line(sc, "ask")
    wait_agent(sc, "waiting")
    return sc


def test_a_yes_no_question_is_waiting_refuses_text_and_its_answer_is_idle(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    sc = dialog_sidecar(make_sidecar, short_tmp)
    events = EventLog(sc)
    wait_agent(sc, "idle")
    type_line(sc, "ask")
    waiting = wait_agent(sc, "waiting")
    assert waiting["reason"] == "Delete the build directory? [y/N]", waiting
    # A prompt typed now would land in the question: refused, naming it.
    code, body = sc.post("/input", {"text": "please refactor the parser"})
    assert code == 409, body
    assert "Delete the build directory?" in body["error"], body
    assert "please refactor" not in (short_tmp / "typed").read_text()
    # Keys answer it (that is how a person does).
    code, body = sc.post("/input", {"keys": ["y", "Enter"]})
    assert code == 202, body
    wait_agent(sc, "idle")
    assert "answer y" in (short_tmp / "typed").read_text()
    events.wait_states(["idle", "working", "waiting", "working", "idle"])
    # Never `idle` while the question was on screen.
    states = [e["state"] for e in events.of("agent-state")]
    asked = states.index("waiting")
    assert "idle" not in states[asked : states.index("working", asked)], states


def test_text_into_a_dialog_is_typed_when_the_client_says_it_means_the_dialog(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    sc = asking(make_sidecar, short_tmp)
    code, body = sc.post("/input", {"text": "y", "if_state": ["waiting"]})
    assert code == 202, body
    wait_agent(sc, "idle")
    assert "answer y" in (short_tmp / "typed").read_text()


def test_a_menu_is_waiting_with_its_title_and_idle_once_chosen(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    sc = ready(make_sidecar, short_tmp)
    type_line(sc, "menu")
    assert wait_agent(sc, "waiting")["reason"] == "Pick a theme"
    code, body = sc.post("/input", {"keys": ["1", "Enter"]})
    assert code == 202, body
    wait_agent(sc, "idle")


def event_time(event: dict[str, Any]) -> float:
    """When the sidecar published an /events line (its `time`), in seconds since the epoch."""
    return datetime.fromisoformat(event["time"]).timestamp()


@pytest.mark.parametrize("paint", ["spin 4", "redraw 4"])
def test_a_pane_painted_continuously_is_working_not_a_dialog(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, paint: str
) -> None:
    """The CLI paints for 4 s from the moment it reads the line. The agent's first `idle`
    after that is the signal that the whole painting was seen: it comes after the painting
    ended, and every state the agent took meanwhile is on /events before it."""
    sc = ready(make_sidecar, short_tmp)
    events = EventLog(sc)
    painted_until = time.time() + float(paint.split()[1])  # the painting ends no sooner
    type_line(sc, paint)
    wait_agent(sc, "working")
    idle = events.wait(
        lambda e: e["type"] == "agent-state" and e["state"] == "idle", "idle after the painting", 15
    )
    assert event_time(idle) >= painted_until, f"idle while the CLI painted ({paint}): {idle}"
    meanwhile = [e for e in events.of("agent-state") if event_time(e) < painted_until]
    assert [e["state"] for e in meanwhile] == ["working"], (
        f"the agent left working while the CLI painted ({paint}): {meanwhile}"
    )


def test_a_cli_with_a_prompt_pattern_is_idle_only_at_that_prompt(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """`prompt_pattern` tells the generic reading the CLI's input prompt: any other quiet
    screen, even one that asks nothing, is a dialog."""
    sc = ready(make_sidecar, short_tmp, prompt_pattern=r"^ready>")
    type_line(sc, "ask")
    assert wait_agent(sc, "waiting")["reason"] == "Delete the build directory?"
    code, body = sc.post("/input", {"keys": ["n", "Enter"]})
    assert code == 202, body
    wait_agent(sc, "idle")


def test_a_supervisor_started_again_reads_the_dialog_off_the_screen_and_leaves_one_client(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    sc = asking(make_sidecar, short_tmp)
    assert sc.proc is not None
    old = supervisor_of(psutil.Process(sc.proc.pid))
    assert old is not None
    os.kill(old.pid, signal.SIGKILL)
    wait_for(
        lambda: (s := sc.status()).get("sidecar_restarts") == 1 and s,
        timeout=15,
        what="the supervisor started again",
    )
    # Read off the screen, not left at `starting` until the CLI prints again.
    again = wait_agent(sc, "waiting", timeout=5)
    assert again["reason"] == "Delete the build directory? [y/N]"

    def control_clients() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            argv = proc.info["cmdline"] or []
            if "-C" in argv and str(sc.state_dir / "tmux.sock") in argv:
                found.append(proc)
        return found

    wait_for(lambda: len(control_clients()) == 1, what="one control client (the new one's)")
    code, body = sc.post("/input", {"keys": ["y", "Enter"]})
    assert code == 202, body
    wait_agent(sc, "idle")
