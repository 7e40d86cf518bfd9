"""The CLI's screen size (`PUT /screen/size`) and a dialog's choices (`/status`'s agent.choices,
`POST /input` with `choice`), against a real sidecar running a login shell in real tmux: the
window takes the size asked, within 80x24..250x60, every viewer is told, a healed tmux server
keeps it; a shell's `[y/N]` question offers y and n, and a choice given answers it; bad bodies
and choices no dialog offers are refused in words."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.agenttools import EventLog, wait_agent
from tests.harness import Sidecar, http, wait_for

TOKEN = "size-admin-token-0123456789"
VIEW = "size-view-token-0123456789"


def window(sc: Sidecar) -> str:
    out = subprocess.run(
        ["tmux", "-S", str(sc.state_dir / "tmux.sock"), "display-message", "-p", "-t", "main",
         "#{window_width}x#{window_height}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def put_size(sc: Sidecar, body: Any, token: str = TOKEN) -> tuple[int, Any]:
    return http("PUT", f"{sc.url}/screen/size", body, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def shell(make_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}).start()


def test_the_screen_takes_the_size_asked_within_its_bounds_and_viewers_are_told(
    shell: Sidecar,
) -> None:
    sc = shell
    events = EventLog(sc, TOKEN)
    assert sc.status()["screen"] == {"cols": 200, "rows": 50} and window(sc) == "200x50"
    assert put_size(sc, {"cols": 107, "rows": 33}) == (200, {"cols": 107, "rows": 33})
    assert window(sc) == "107x33"
    assert sc.status()["screen"] == {"cols": 107, "rows": 33}
    screen = sc.get("/screen")[1]
    assert (screen["cols"], screen["rows"], len(screen["lines"])) == (107, 33, 33)
    told = events.wait(lambda e: e["type"] == "screen-resized", "screen-resized")
    assert (told["cols"], told["rows"]) == (107, 33)
    # A phone's size, and a wall's: the bounds are applied, not refused.
    assert put_size(sc, {"cols": 40, "rows": 10}) == (200, {"cols": 80, "rows": 24})
    assert window(sc) == "80x24"
    assert put_size(sc, {"cols": 900, "rows": 300}) == (200, {"cols": 250, "rows": 60})
    assert window(sc) == "250x60"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"cols": 0, "rows": 40}, "cols"),
        ({"cols": 120}, "rows"),
        ({"cols": "120", "rows": 40}, "cols"),
        ({"cols": 120, "rows": 40, "font": 12}, "font"),
        ([120, 40], "object"),
    ],
)
def test_a_bad_size_is_a_400_naming_what_is_wrong_and_changes_nothing(
    shell: Sidecar, body: Any, words: str
) -> None:
    code, answer = put_size(shell, body)
    assert code == 400 and words in answer["error"], answer
    assert window(shell) == "200x50"


def test_a_viewer_cannot_size_the_screen(shell: Sidecar) -> None:
    code, answer = put_size(shell, {"cols": 100, "rows": 30}, token=VIEW)
    assert (code, answer) == (403, {"error": "the view token is read-only"})
    assert window(shell) == "200x50"


def test_a_tmux_server_made_again_keeps_the_size(shell: Sidecar) -> None:
    sc = shell
    assert put_size(sc, {"cols": 132, "rows": 43})[0] == 200
    heals = sc.status()["sidecar_restarts"], window(sc)
    subprocess.run(["tmux", "-S", str(sc.state_dir / "tmux.sock"), "kill-server"], check=False)
    wait_for(lambda: "tmux server" in sc.log() and sc.status()["cli_running"], 30, what="heal")
    wait_for(lambda: window(sc) == "132x43", 30, what=f"the healed window's size ({heals})")


def test_a_shells_yes_no_question_offers_y_and_n_and_a_choice_answers_it(shell: Sidecar) -> None:
    sc = shell
    code, _ = sc.post("/input", {"text": "read -p 'Delete the build? [y/N] ' a; echo \"got=$a\""})
    assert code == 202
    agent = wait_agent(sc, "waiting")
    assert agent["reason"] == "Delete the build? [y/N]"
    assert agent["choices"] == [
        {"label": "y", "decision": None, "remember": False},
        {"label": "n", "decision": None, "remember": False},
    ]
    # A choice the dialog does not offer: nothing typed, and the words say what it offers.
    code, answer = sc.post("/input", {"choice": "maybe"})
    assert code == 409
    assert answer["error"] == (
        "the dialog on screen does not offer 'maybe' (it offers 'y', 'n')"
    ), answer
    code, answer = sc.post("/input", {"choice": "y"})
    assert code == 202, answer
    wait_for(lambda: any("got=y" in line for line in sc.get("/screen")[1]["lines"]), 10)
    wait_agent(sc, "idle", 15)
    code, answer = sc.post("/input", {"choice": "y"})
    assert code == 409 and answer["error"] == "no dialog to answer: the agent is idle", answer
    assert sc.status()["agent"]["choices"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"choice": "y", "keys": ["y"]},
        {"choice": "y", "text": "y"},
        {"choice": "y", "submit": True},
        {"choice": ""},
        {"choice": 1},
    ],
    ids=json.dumps,
)
def test_a_bad_choice_body_is_a_400(shell: Sidecar, body: dict[str, Any]) -> None:
    code, answer = shell.post("/input", body)
    assert code == 400, answer


def test_status_says_what_the_token_may_do(shell: Sidecar) -> None:
    assert shell.status()["access"] == "read-write"
    code, body = shell.get("/status", headers={"Authorization": f"Bearer {VIEW}"})
    assert code == 200 and body["access"] == "read-only"
