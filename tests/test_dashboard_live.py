"""The dashboard in a real headless Chromium against a real sidecar running a login shell: the
whole of a 200-column screen at 1280 and 1920 px, a shell's `[y/N]` question answered by its own
y/n buttons while the prompt box is disabled, a view token and a wrong one told what they can
do, the sidecar stopped (said within 5 s, greyed out), ttyd killed and healed (the terminal
shows new output with no reload). Screenshots are kept as artifacts/dashboard-*.png."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.agenttools import wait_agent
from tests.e2e.cdp import TERMINAL_TEXT_JS, Browser, fresh_artifact
from tests.harness import Sidecar, wait_for

pytestmark = pytest.mark.browser
TOKEN = "dash-live-writer-0123456789"
VIEW = "dash-live-viewer-0123456789"

# Where the xterm's last column is drawn, against the window's width; its size in cells.
FIT_JS = """
(() => {
  const frame = document.getElementById('terminal');
  const term = frame.contentWindow && frame.contentWindow.term;
  if (!term || !term.element) return '{}';
  const screen = term.element.querySelector('.xterm-screen').getBoundingClientRect();
  const box = frame.getBoundingClientRect();
  return JSON.stringify({
    cols: term.cols, rows: term.rows, font: term.options.fontSize,
    right: box.left + screen.right, bottom: box.top + screen.bottom,
    width: window.innerWidth, height: window.innerHeight,
    size: document.getElementById('term-size').textContent,
  });
})()
"""
WHOLE_JS = """
(() => {
  const term = document.getElementById('terminal').contentWindow.term;
  if (!term) return '';
  return term.cols >= 200 && term.rows >= 50 ? 'whole' : `${term.cols}x${term.rows}`;
})()
"""
CONTROLS_JS = """
JSON.stringify({
  choices: [...document.querySelectorAll('#choices button')].map(b => b.textContent),
  prompt: document.getElementById('prompt-input').disabled,
  placeholder: document.getElementById('prompt-input').placeholder,
  state: document.getElementById('agent-state').textContent,
  result: document.getElementById('input-result').textContent,
})
"""
PAGE_JS = """
JSON.stringify({
  banner: document.getElementById('banner-text').textContent,
  shown: document.getElementById('banner').classList.contains('shown'),
  stale: document.body.classList.contains('stale'),
  live: document.getElementById('live').textContent,
  note: document.getElementById('access-note').textContent,
  access: document.body.dataset.access || '',
  term: document.getElementById('term-state').textContent,
  mark: String(window.notReloaded),
})
"""


def pane_command(sc: Sidecar, line: str) -> None:
    subprocess.run(
        ["tmux", "-S", str(sc.state_dir / "tmux.sock"), "send-keys", "-t", "main", line, "Enter"],
        check=True,
    )


@pytest.fixture
def shell(make_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}).start()


@pytest.mark.parametrize("width", [1280, 1920])
async def test_the_last_column_of_a_200_column_line_is_on_screen(
    chromium: str, shell: Sidecar, tmp_path: Path, width: int
) -> None:
    """A view token (it does not size the screen): the 200x50 screen is shown whole, its
    font fitted, and the line's last column is drawn inside the window."""
    sc = shell
    assert sc.status()["screen"] == {"cols": 200, "rows": 50}
    # 199 dashes then Z, printed by the shell (not typed: the typed line would hold it too).
    pane_command(sc, "clear; printf '%0.s-' $(seq 199); printf 'Z\\n'")
    shot = fresh_artifact(f"dashboard-{width}.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (width, 1000))
    try:
        await browser.open(f"{sc.url}/?token={VIEW}")
        await browser.wait_for_text(TERMINAL_TEXT_JS, ["-" * 199 + "Z"], 30)
        await browser.wait_for_text(FIT_JS, ['"size":"200×50"'], 15)
        # The xterm fits itself to the frame once it is laid out: a frame or two later.
        await browser.wait_for_text(WHOLE_JS, ["whole"], 10)
        fit = json.loads(await browser.evaluate(FIT_JS))
        await browser.screenshot(shot)
    finally:
        await browser.close()
    assert (fit["cols"], fit["rows"]) >= (200, 50), fit
    assert fit["right"] <= fit["width"] and fit["bottom"] <= fit["height"], fit
    assert fit["font"] >= 10, fit  # legible at both widths (the page's floor is 9 px)
    assert sc.status()["screen"] == {"cols": 200, "rows": 50}  # a viewer did not resize it


async def test_a_y_n_question_offers_y_and_n_and_the_prompt_box_waits_for_the_answer(
    chromium: str, shell: Sidecar, tmp_path: Path
) -> None:
    """A shell's `read -p '... [y/N] '`: the waiting bar offers "y" and "n" (not numbers), the
    prompt box is disabled with a sentence; clicking "y" answers it, and the box comes back."""
    sc = shell
    shot = fresh_artifact("dashboard-yn.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1400, 900))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await browser.wait_for_text("String(document.body.dataset.access)", ["writer"], 15)
        pane_command(sc, "clear; read -p 'Delete the build? [y/N] ' a; echo \"got=$a\"")
        wait_agent(sc, "waiting")
        shown = json.loads(await browser.wait_for_text(CONTROLS_JS, ['"choices":["y","n"]'], 15))
        assert shown["prompt"] is True, shown
        assert shown["placeholder"] == "the agent is asking something: answer it first", shown
        await browser.screenshot(shot)
        await browser.evaluate(
            "[...document.querySelectorAll('#choices button')].find(b => b.textContent === 'y')"
            ".click()"
        )
        await browser.wait_for_text(TERMINAL_TEXT_JS, ["got=y"], 15)
        after = json.loads(await browser.wait_for_text(CONTROLS_JS, ['"prompt":false'], 15))
    finally:
        await browser.close()
    assert after["choices"] == [] and "done" in after["result"], after


async def test_a_view_token_and_a_wrong_one_are_told_what_they_can_do(
    chromium: str, shell: Sidecar, tmp_path: Path
) -> None:
    """No request is sent to probe rights: /status says the token's access. A view token is
    told it watches only (no prompt box); a wrong token is told to paste the right one, and
    the page a browser opens with it says so in words with a form (not JSON)."""
    sc = shell
    browser = await Browser.start(chromium, tmp_path / "profile", (1280, 900))
    try:
        await browser.open(f"{sc.url}/?token={VIEW}")
        viewer = json.loads(await browser.wait_for_text(PAGE_JS, ["View only", "viewer"], 15))
        hidden = await browser.evaluate(
            "getComputedStyle(document.getElementById('controls')).display"
        )
    finally:
        await browser.close()
    browser = await Browser.start(chromium, tmp_path / "profile2", (1280, 900))  # no cookie
    try:
        await browser.open(f"{sc.url}/?token=not-the-token-0123456789")
        refused = await browser.wait_for_text("document.body.innerText", ["not this sleeve"], 15)
        form = await browser.evaluate("document.querySelectorAll('form input[name=token]').length")
    finally:
        await browser.close()
    assert "typing, answering and sizing the screen need the API token" in viewer["note"]
    assert hidden == "none"
    assert "the token in this link is not this sleeve's" in refused.lower(), refused
    assert "{" not in refused and form == 1, refused
    # No empty POST /input probed the token's rights.
    metrics = sc.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})[1]
    assert 'route="/input"' not in str(metrics), metrics


async def test_a_stopped_sidecar_is_said_within_5_s_and_what_the_page_knew_is_greyed(
    chromium: str, shell: Sidecar, tmp_path: Path
) -> None:
    sc = shell
    shot = fresh_artifact("dashboard-unreachable.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1280, 900))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await browser.wait_for_text(PAGE_JS, ['"live":"live"'], 15)
        stopped = time.monotonic()
        assert sc.stop() == 0
        # Greyed is the page's own verdict (its /health probe failed): a request that failed
        # meanwhile can say "cannot be reached" a moment before, while that probe is still out.
        page = json.loads(await browser.wait_for_text(PAGE_JS, ['"stale":true'], 10))
        said = time.monotonic() - stopped
        await browser.screenshot(shot)
    finally:
        await browser.close()
    assert said <= 5.0, said  # the bound
    assert page["stale"] is True and page["shown"] is True, page
    assert page["live"] == "unreachable", page
    assert "reconnects by itself" in page["banner"], page
    assert "Failed to fetch" not in page["banner"], page


async def test_the_terminal_reconnects_by_itself_when_ttyd_comes_back(
    chromium: str, shell: Sidecar, tmp_path: Path
) -> None:
    """ttyd killed (SIGKILL) and started again by the supervisor: the terminal frame shows the
    pane's new output with no reload of the page (a mark set in the page survives)."""
    sc = shell
    assert sc.proc is not None
    browser = await Browser.start(chromium, tmp_path / "profile", (1280, 900))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        pane_command(sc, "echo BEFORE-$((6*7))")
        await browser.wait_for_text(TERMINAL_TEXT_JS, ["BEFORE-42"], 30)
        await browser.evaluate("window.notReloaded = true")
        [ttyd] = [
            p for p in psutil.Process(sc.proc.pid).children(recursive=True) if p.name() == "ttyd"
        ]
        ttyd.kill()
        wait_for(
            lambda: [
                p
                for p in psutil.Process(sc.proc.pid).children(recursive=True)  # type: ignore[union-attr]
                if p.name() == "ttyd" and p.pid != ttyd.pid
            ],
            30,
            what="a new ttyd",
        )
        sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd running again")
        pane_command(sc, "echo AFTER-$((6*7))")
        await browser.wait_for_text(TERMINAL_TEXT_JS, ["AFTER-42"], 30)
        page = json.loads(await browser.evaluate(PAGE_JS))
    finally:
        await browser.close()
    assert page["mark"] == "true", page  # the page itself was not loaded again
