"""The dashboard at GET / in a real headless Chromium against a real sidecar: the page fills in
from the API, and its embedded terminal connects through the /terminal proxy."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.e2e.pngcheck import count_near, read_png
from tests.harness import REPO, Sidecar, wait_for

TOKEN = "dash-token-1234567890"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        CHROMIUM is None and os.environ.get("CI") != "true", reason="chromium not installed"
    ),
]


def chromium(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM, "chromium is required (scripts/setup --test installs it)"
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        argv = [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1200,900",
            *args,
        ]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


class Texts(HTMLParser):
    """Text content by element id, from Chromium's --dump-dom output."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []
        self.text: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("meta", "link", "br", "input", "img", "hr"):
            return
        self.stack.append(dict(attrs).get("id"))

    def handle_endtag(self, tag: str) -> None:
        if self.stack and tag not in ("meta", "link", "br", "input", "img", "hr"):
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        for ident in self.stack:
            if ident:
                self.text[ident] = self.text.get(ident, "") + data


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


def test_dashboard_dom_shows_status_progress_blockers_and_outbox(
    dashboard_sidecar: Sidecar,
) -> None:
    sc = dashboard_sidecar
    result = chromium("--virtual-time-budget=8000", "--dump-dom", f"{sc.url}/?token={TOKEN}")
    assert result.returncode == 0, result.stderr[-2000:]
    texts = Texts()
    texts.feed(result.stdout)
    assert "test-sleeve" in texts.text.get("sleeve-id", "")
    assert "shell" in texts.text.get("cli", "")
    assert "healthy" in texts.text.get("health", "")
    assert "working" in texts.text.get("status", "")
    assert "Ship the dashboard" in texts.text.get("task", "")
    assert "1/2" in texts.text.get("progress", "")
    assert "waiting for fonts" in texts.text.get("blockers", "")
    assert "Dashboard milestone reached." in texts.text.get("outbox", "")
    assert 'id="terminal"' in result.stdout
    # The embedded terminal opened its WebSocket through the proxy.
    assert "terminal client connected (read-write)" in sc.log()


def test_dashboard_screenshot_shows_the_terminal(dashboard_sidecar: Sidecar) -> None:
    sc = dashboard_sidecar
    artifacts = Path(os.environ.get("SIDECAR_ARTIFACTS", REPO / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / "dashboard.png"
    shot.unlink(missing_ok=True)
    result = chromium(
        "--virtual-time-budget=8000", f"--screenshot={shot}", f"{sc.url}/?token={TOKEN}"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    wait_for(shot.exists, what="screenshot written")
    width, height, rows = read_png(shot)
    assert (width, height) == (1200, 900)
    # The page is dark with light text; an empty or error page would be near-uniform.
    assert count_near(rows, (13, 17, 23), tolerance=12) > width * height // 10
    assert count_near(rows, (214, 221, 230), tolerance=60) > 500
    assert "terminal client connected" in sc.log()
