"""The dashboard replays a recording with the asciinema web player in a real headless Chromium,
against a real sidecar whose shell printed a line: the player (served by the sidecar, from the
pinned package scripts/setup installed) loads under the page's CSP, draws the recorded screen, and
a click on a marker in the list moves the player to that marker's time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.api.recordings import PLAYER_DIR, PLAYER_FILES
from tests.e2e.cdp import Browser, fresh_artifact
from tests.harness import Sidecar, wait_for
from tests.tools import missing

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(120)]
TOKEN = "replay-writer-token-0123456789"
LINE = "REPLAYED-LINE-4242"

PLAYER_TEXT_JS = "document.getElementById('replay-player').innerText"
STATE_JS = """
JSON.stringify(window.sleeveReplay ? {
  time: window.sleeveReplay.player.getCurrentTime(),
  markers: window.sleeveReplay.markers,
  note: document.getElementById('replay-note').textContent,
  buttons: document.querySelectorAll('#replay-markers button').length,
} : {note: document.getElementById('replay-note').textContent})
"""


def recorded_run(make_sidecar: Callable[..., Sidecar]) -> tuple[Sidecar, str]:
    """A sidecar whose shell printed LINE, and the id of that run's recording (ended by a
    resleeve, so that it has a beginning and an end)."""
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_ACTIVITY_QUIET": "0.5"})
    sc.start()
    assert sc.post("/input", {"text": f"echo {LINE}"})[0] == 202
    wait_for(lambda: any(LINE in line for line in sc.get("/screen")[1]["lines"][1:]), 10)
    sc.wait_status(lambda s: s["agent"]["state"] == "idle", "the shell idle again")
    [first] = sc.get("/recordings")[1]["recordings"]
    assert sc.post("/resleeve", {})[0] == 202

    def ended() -> dict | None:
        found = {r["id"]: r for r in sc.get("/recordings")[1]["recordings"]}
        return found[first["id"]] if found[first["id"]]["ended"] else None

    wait_for(ended, 15, what="the first run's recording ended")
    return sc, first["id"]


async def test_the_dashboard_replays_a_recording_and_jumps_to_a_marker(
    chromium: str, make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    if not all((PLAYER_DIR / name).is_file() for name in PLAYER_FILES):
        missing(f"the asciinema player is not installed in {PLAYER_DIR} (scripts/setup)")
    sc, rec_id = recorded_run(make_sidecar)
    shot = fresh_artifact("dashboard-replay.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1400, 900))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await browser.wait_for_text(
            "document.getElementById('recordings').innerText", ["replay", "markers"], 15
        )
        clicked = await browser.evaluate(
            f'(() => {{ const b = document.querySelector(\'#recordings li[data-id="{rec_id}"] '
            "button'); if (b) b.click(); return !!b; })()"
        )
        assert clicked
        state = json.loads(await browser.wait_for_text(STATE_JS, ['"buttons"'], 20))
        markers = state["markers"]
        labels = [label for _, label in markers]
        assert "working" in labels and "idle" in labels, labels
        assert labels[-1] == "resleeve: shell -> shell" or "exited" in labels[-1], labels
        # The last "idle" comes after the line was printed: jumping there shows it.
        index = max(i for i, label in enumerate(labels) if label == "idle")
        await browser.evaluate(
            f"document.querySelector('#replay-markers button[data-index=\"{index}\"]').click()"
        )
        await browser.wait_for_text(PLAYER_TEXT_JS, [LINE], 15)
        moved = json.loads(await browser.evaluate(STATE_JS))
        assert moved["time"] > 0, moved
        await browser.screenshot(shot)
        # The first marker ("working", as the line is typed) is earlier on the player's clock.
        await browser.evaluate(
            "document.querySelector('#replay-markers button[data-index=\"0\"]').click()"
        )
        back = await browser.wait_for_text(
            f"String(window.sleeveReplay.player.getCurrentTime() < {moved['time']})", ["true"], 10
        )
        assert back == "true"
    finally:
        await browser.close()
