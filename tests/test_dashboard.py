"""The dashboard at GET / in a real headless Chromium against a real sidecar: the page fills in
from the API, and its embedded terminal connects through the /terminal proxy and shows the pane."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.cdp import TERMINAL_TEXT_JS, Browser, fresh_artifact
from tests.e2e.pngcheck import count_near, read_png
from tests.harness import Sidecar
from tests.standin import waiting_sidecar

TOKEN = "dash-token-1234567890"
pytestmark = pytest.mark.browser


@pytest.fixture
def dashboard_sidecar(make_sidecar: Callable[..., Sidecar]) -> Sidecar:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SLEEVE_GOAL": "Ship the dashboard"})
    sc.start()
    current = sc.workspace / ".cstack" / "CURRENT.md"
    text = current.read_text()
    text = text.replace("## Progress\n", "## Progress\n- [x] draw it\n- [ ] test it\n")
    text = text.replace("## Blockers\n(none)", "## Blockers\n- waiting for fonts")
    current.write_text(text)
    outbox = sc.workspace / ".needlecast" / "outbox.md"
    outbox.parent.mkdir(exist_ok=True)
    outbox.write_text(
        "---\nid: msg-dash1\nfrom: test-sleeve\nto: envoy\ntype: milestone\n"
        "time: 2026-01-21T10:10:00Z\n---\nDashboard milestone reached.\n"
    )
    assert (
        sc.post("/inbox", {"from": "envoy", "type": "task", "content": "Inbox task here."})[0]
        == 201
    )
    subprocess.run(
        [
            "tmux",
            "-S",
            str(sc.state_dir / "tmux.sock"),
            "send-keys",
            "-t",
            "main",
            "clear; echo KNOWN-PANE-TEXT",
            "Enter",
        ],
        check=True,
    )
    return sc


FIELDS_JS = """
JSON.stringify(Object.fromEntries(
  ['sleeve-id', 'cli', 'health', 'status', 'task', 'progress', 'blockers', 'outbox', 'inbox',
   'agent-state', 'agent-since']
    .map(id => [id, (document.getElementById(id) || {}).textContent || ''])))
"""


async def test_dashboard_shows_status_progress_blockers_outbox_and_the_live_terminal(
    chromium: str, dashboard_sidecar: Sidecar, tmp_path: Path
) -> None:
    """Chromium driven over DevTools: every panel filled in from the API, and the embedded
    terminal's own screen (its xterm.js buffer) showing the pane's known text; then the PNG is
    kept as artifacts/dashboard.png and checked to be the dark page with light text."""
    sc = dashboard_sidecar
    shot = fresh_artifact("dashboard.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1200, 900))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await browser.wait_for_text(TERMINAL_TEXT_JS, ["KNOWN-PANE-TEXT"], 30)
        wanted = ["test-sleeve", "healthy", "Ship the dashboard", "1/2", "waiting for fonts"]
        fields = json.loads(
            await browser.wait_for_text(FIELDS_JS, [*wanted, "Dashboard milestone reached."], 15)
        )
        await browser.wait_for_text(FIELDS_JS, ["Inbox task here.", "idle"], 15)
        controls = await browser.evaluate(
            "document.getElementById('controls').classList.contains('writer')"
        )
        await browser.screenshot(shot)
        dom = await browser.evaluate("document.documentElement.outerHTML")
    finally:
        await browser.close()
    assert "test-sleeve" in fields["sleeve-id"]
    assert "shell" in fields["cli"]
    assert "healthy" in fields["health"]
    assert "working" in fields["status"]
    assert "Ship the dashboard" in fields["task"]
    assert "1/2" in fields["progress"]
    assert "waiting for fonts" in fields["blockers"]
    assert "Dashboard milestone reached." in fields["outbox"]
    # The agent's state, and a prompt box for this writer token.
    assert controls is True
    assert 'id="agent-state"' in dom and 'class="s-' in dom
    assert 'id="terminal"' in dom
    # The terminal connected through the proxy, with the cookie the ?token= visit set.
    assert "terminal client connected (read-write)" in sc.log()
    width, height, rows = read_png(shot)
    assert width == 1200  # the viewport of a 1200x900 window
    # The page is dark with light text; an empty or error page would be near-uniform.
    assert count_near(rows, (13, 17, 23), tolerance=12) > width * height // 10
    assert count_near(rows, (214, 221, 230), tolerance=60) > 500


BADGE_JS = """
JSON.stringify({
  badge: document.getElementById('agent-badge').textContent.replace(/\\s+/g, ' ').trim(),
  reason: document.getElementById('agent-reason').textContent,
  injected: document.querySelectorAll('#agent img, #agent b').length,
  task: document.getElementById('status-chip').textContent,
  title: document.title,
})
"""


async def test_a_waiting_agents_reason_is_on_its_badge_and_the_task_status_is_labelled(
    chromium: str, make_sidecar: Callable[..., Sidecar], short_tmp: Path, tmp_path: Path
) -> None:
    """The agent waits on a permission prompt (Claude Code's hook, from a stand-in): its badge
    reads `waiting` and what for, as text (markup in the command stays text); the CURRENT.md
    status beside it says it is the task file's (`task file: working`), not the agent's. The
    PNG is kept as artifacts/dashboard-waiting.png."""
    command = "rm -rf build <img src=x onerror=alert(1)> <b>bold</b>"
    sc = waiting_sidecar(
        make_sidecar,
        short_tmp,
        command,
        SIDECAR_TOKEN=TOKEN,
        SLEEVE_GOAL="Clean the build",  # CURRENT.md status: working
    )
    reason = sc.status()["agent"]["reason"]
    assert reason and "rm -rf build" in reason
    shot = fresh_artifact("dashboard-waiting.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1200, 700))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        shown = json.loads(await browser.wait_for_text(BADGE_JS, ["waiting", reason], 15))
        await browser.screenshot(shot)
    finally:
        await browser.close()
    assert shown["badge"].startswith("waiting") and reason in shown["badge"], shown
    assert shown["reason"] == reason  # as text, whole: the markup in it was not parsed
    assert shown["injected"] == 0
    assert shown["task"] == "task file: working", shown
    assert shown["title"] == "test-sleeve · waiting", shown
    width, _, rows = read_png(shot)
    assert width == 1200
    # The waiting bar's amber text is on screen.
    assert count_near(rows, (210, 153, 34), tolerance=40) > 200
