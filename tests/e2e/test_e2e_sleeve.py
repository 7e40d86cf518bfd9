"""The real end-to-end: `sleeve run --runtime docker` of the built image with the real Claude
Code CLI (talking to the Anthropic API stub on 127.0.0.1), driven the way a user and an envoy
drive it - the launcher, the HTTP API, the web terminal, `docker exec`, a browser.

The Claude Code sleeve is shared by the tests of this module (starting it is the expensive
part), which run in any order: each leaves it running claude-code, and none needs what another
did to it. The one test that removes its container starts a sleeve of its own.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import dockerenv, pngcheck
from tests.e2e.anthropic_stub import REPLY_TEXT, AnthropicStub
from tests.e2e.cdp import Browser
from tests.e2e.conftest import (
    E2E_TOKEN,
    Launcher,
    Sleeve,
    descendants,
    health_ok,
    new_launcher,
    processes,
    remove_started,
)
from tests.e2e.ttyclient import TerminalClient
from tests.harness import wait_for, wait_for_async

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "say hello to the sleeve e2e test"
GOAL = "Prove the sleeve end to end"


@pytest.fixture(scope="module")
def claude(
    engine: dockerenv.Engine,
    image: str,
    stub: AnthropicStub,
    tmp_path_factory: pytest.TempPathFactory,
    timings: dict[str, float],
) -> Iterator[tuple[Launcher, Sleeve]]:
    lch = new_launcher(engine, stub, tmp_path_factory.mktemp("claude"))
    lch.create_slot()
    t0 = time.monotonic()
    sleeve = lch.run("--slot", "1", "--goal", GOAL, cli="claude-code")
    timings["sleeve_run_claude_code"] = round(time.monotonic() - t0, 2)
    yield lch, sleeve
    remove_started(lch)


def test_sleeve_run_claude_code_is_healthy_with_the_sidecar_as_pid_1(
    claude: tuple[Launcher, Sleeve],
) -> None:
    lch, sleeve = claude
    body = wait_for(lambda: health_ok(sleeve.port), 10, what="/health 200")
    assert set(body) >= {"status", "uptime"}
    cmdline = lch.exec(sleeve, "cat", "/proc/1/cmdline").stdout.split("\0")
    assert any(part.endswith("sidecar") for part in cmdline[:2]), cmdline
    status = wait_for(lambda: sleeve.cli_up("claude-code"), 15, what="claude-code running")
    table = processes(lch, sleeve)
    assert "claude" in table[status["cli_pid"]][1]
    assert status["status"] == "working" and status["current_task"] == GOAL
    # The image's HEALTHCHECK is active in a launched sleeve (its first probe comes after the
    # 30 s interval; `healthy` itself is proven with a short interval in test_e2e_image).
    health = lch.engine.docker("inspect", "--format", "{{.State.Health.Status}}", sleeve.container)
    assert health.stdout.strip() in ("starting", "healthy")


async def _submit_prompt(term: TerminalClient, stub: AnthropicStub, prompt: str) -> int:
    """Type `prompt` at Claude Code's prompt, submit it, and wait until it reaches the API;
    returns where the terminal's output stood before the typing."""
    await term.wait_for("Claude Code", 30)
    await term.wait_for("❯", 10)
    mark = len(term.raw)
    await term.type(prompt)
    # Enter only once the text is drawn: text and CR in one read would look like a paste.
    await term.wait_for(prompt, 10, since=mark)
    await term.type("\r")
    wait_for(lambda: any(prompt in p for p in stub.prompts_seen()), 30, what="POST /v1/messages")
    return mark


async def test_terminal_shows_the_claude_prompt_and_a_typed_prompt_reaches_the_api(
    claude: tuple[Launcher, Sleeve], stub: AnthropicStub
) -> None:
    _, sleeve = claude
    term = await TerminalClient.connect(
        f"ws://127.0.0.1:{sleeve.port}/terminal/ws?token={E2E_TOKEN}"
    )
    try:
        mark = await _submit_prompt(term, stub, PROMPT)
        await term.wait_for(REPLY_TEXT, 30, since=mark)
    finally:
        await term.close()


def test_resleeve_to_shell_and_back_replaces_the_whole_process_tree(
    claude: tuple[Launcher, Sleeve],
) -> None:
    lch, sleeve = claude
    for cli in ("shell", "claude-code"):
        before = sleeve.status()
        old_tree = descendants(processes(lch, sleeve), before["cli_pid"])
        code, body = sleeve.post("/resleeve", {"cli": cli})
        assert code == 202 and body == {"status": "resleeving", "cli": cli}, body
        after = wait_for(
            lambda c=cli, p=before["cli_pid"]: sleeve.cli_up(c, p), 30, what=f"{cli} up"
        )
        table = processes(lch, sleeve)
        assert not old_tree & set(table), f"left over from {before['cli']}: {old_tree & set(table)}"
        new_cmd = table[after["cli_pid"]][1]
        assert ("claude" in new_cmd) if cli == "claude-code" else ("bash" in new_cmd)


def test_docker_exec_sidecar_status_and_outbox_work_and_a_written_message_is_acked(
    claude: tuple[Launcher, Sleeve],
) -> None:
    lch, sleeve = claude
    status = lch.exec(sleeve, "sidecar", "status")
    assert "claude-code" in status.stdout
    as_json = json.loads(lch.exec(sleeve, "sidecar", "status", "--json").stdout)
    assert as_json["cli"] == "claude-code"
    message = (
        "---\nid: e2e-milestone-1\nfrom: sleeve\nto: envoy\nthread: e2e\ntype: milestone\n"
        "time: '2026-01-01T00:00:00Z'\n---\nReached the **e2e** milestone.\n"
    )
    lch.engine.docker(
        "exec", "-i", sleeve.container, "sh", "-c",
        "mkdir -p /workspace/.needlecast && cat >> /workspace/.needlecast/outbox.md",
        input=message.encode(),
    )  # fmt: skip

    def listed() -> dict | None:
        code, body = sleeve.get("/outbox")
        ids = [m["id"] for m in body["messages"]] if code == 200 else []
        return body if "e2e-milestone-1" in ids else None

    body = wait_for(listed, 10, what="the message at /outbox")
    msg = next(m for m in body["messages"] if m["id"] == "e2e-milestone-1")
    assert msg["type"] == "milestone" and "e2e" in msg["content"]
    assert "e2e-milestone-1" in lch.exec(sleeve, "sidecar", "outbox").stdout
    code, body = sleeve.post("/outbox/ack", {"ids": ["e2e-milestone-1"]})
    assert code == 200 and body["removed"] == 1, body
    code, body = sleeve.get("/outbox")
    assert "e2e-milestone-1" not in [m["id"] for m in body["messages"]]


# The rows the page's terminal (ttyd's xterm.js, in its frame) has in view.
VIEWPORT_JS = """
(() => {
  const frame = document.getElementById('terminal');
  const term = frame && frame.contentWindow && frame.contentWindow.term;
  if (!term) return [];
  const buf = term.buffer.active, rows = [];
  for (let i = buf.viewportY; i < buf.viewportY + term.rows; i++) {
    const line = buf.getLine(i);
    rows.push(line ? line.translateToString(true) : '');
  }
  return rows;
})()
"""


def _rows(lines: list[str], cols: int) -> list[str]:
    """A screen's rows as `cols` columns show them, without trailing blanks: a terminal wider
    than the CLI's screen has cells right of it that tmux leaves as they were."""
    rows = [line[:cols].rstrip() for line in lines]
    while rows and not rows[-1]:
        rows.pop()
    return rows


def _logo(shot: Path) -> int:
    """Pixels of Claude Code's orange, in which it draws its logo: tmux passes it on as
    256-colour #d78787 (or as true colour #d77757), and only the real TUI puts a block of it
    on screen."""
    _, _, rows = pngcheck.read_png(shot)
    return pngcheck.count_near(rows, (215, 135, 135), 20) + pngcheck.count_near(
        rows, (215, 119, 87), 20
    )


@pytest.mark.browser
async def test_dashboard_in_headless_chromium_shows_the_claude_code_terminal(
    chromium: str, claude: tuple[Launcher, Sleeve], artifacts: Path, tmp_path: Path
) -> None:
    """The page is driven over DevTools: its embedded terminal (the xterm.js buffer) must show,
    row for row, the screen tmux has of the CLI's pane (GET /screen), and that screen must be
    Claude Code's, with its banner and its prompt; the PNG taken of it then must show Claude
    Code's logo, and is kept as artifacts/e2e/dashboard.png.

    Nothing is read while it is being drawn: the page sizes the screen to its panel after its
    terminal connects (PUT /screen/size) and Claude Code redraws at the new size, so a text seen
    in the terminal before that may be half of a redraw, and a picture taken during one is
    black. What is waited for is the terminal and the pane agreeing on a Claude Code screen,
    and a picture of it."""
    _, sleeve = claude
    wait_for(lambda: sleeve.cli_up("claude-code"), 15, what="claude-code running")
    shot = artifacts / "dashboard.png"
    shot.unlink(missing_ok=True)
    seen: dict[str, object] = {}

    async def shows_claude_code() -> list[str] | None:
        code, screen = await asyncio.to_thread(sleeve.get, "/screen")
        if code != 200:
            return None
        pane = _rows(screen["lines"], screen["cols"])
        view = _rows(await browser.evaluate(VIEWPORT_JS) or [], screen["cols"])
        seen.update(view=view, pane=pane, logo=None)
        text = "\n".join(pane)
        if view != pane or "Claude Code v2.1.330" not in text or "❯" not in text:
            return None
        await browser.screenshot(shot)
        seen["logo"] = logo = _logo(shot)
        return pane if logo > 300 else None

    browser = await Browser.start(chromium, tmp_path / "profile", (1400, 900))
    try:
        await browser.open(f"{sleeve.url}/?token={E2E_TOKEN}")
        await wait_for_async(
            shows_claude_code,
            30,
            interval=0.2,
            what=lambda: (
                "the terminal showing the pane's Claude Code screen, and its logo: "
                + json.dumps(seen, ensure_ascii=False, indent=1)
            ),
        )
        await browser.wait_for_text("document.getElementById('cli').textContent", ["claude"], 10)
        dom = await browser.evaluate("document.documentElement.outerHTML")
    finally:
        await browser.close()
    assert 'id="terminal"' in dom and 'src="terminal/"' in dom
    assert ">claude-code<" in dom
    assert GOAL in dom


def test_the_launched_sleeve_turns_healthy_in_dockers_own_check(
    claude: tuple[Launcher, Sleeve],
) -> None:
    """Step 1's `healthy`, for the sleeve `sleeve run` started with the image's own HEALTHCHECK
    (30 s interval: `sleeve run` passes no health options). The other tests usually take that
    long already; otherwise this waits for the first probe."""
    lch, sleeve = claude

    def health() -> str:
        fmt = "{{.State.Health.Status}}"
        return lch.engine.docker("inspect", "--format", fmt, sleeve.container).stdout.strip()

    assert wait_for(
        lambda: health() == "healthy" or None, 75, what="docker health healthy", interval=1
    )


@pytest.fixture
def own_claude(
    engine: dockerenv.Engine, image: str, stub: AnthropicStub, tmp_path: Path
) -> Iterator[tuple[Launcher, Sleeve]]:
    """A Claude Code sleeve for one test alone (one that removes its container)."""
    lch = new_launcher(engine, stub, tmp_path)
    lch.create_slot()
    yield lch, lch.run("--slot", "1", "--goal", GOAL, cli="claude-code")
    remove_started(lch)


async def test_hard_resleeve_keeps_cstack_and_the_cli_history(
    own_claude: tuple[Launcher, Sleeve], stub: AnthropicStub
) -> None:
    """Remove the container, `sleeve run` the same slot: workspace state and the instance's
    CLI history (bind mounts) are there, and Claude Code resumes (`--continue`). The history
    is this test's own: a turn taken first, and the container removed only once the prompt is
    in history.jsonl and the conversation in projects/ (what the sidecar resumes by)."""
    lch, sleeve = own_claude
    prompt = "remember this across the hard resleeve"
    term = await TerminalClient.connect(
        f"ws://127.0.0.1:{sleeve.port}/terminal/ws?token={E2E_TOKEN}"
    )
    try:
        mark = await _submit_prompt(term, stub, prompt)
        await term.wait_for(REPLY_TEXT, 30, since=mark)
    finally:
        await term.close()

    history, projects = "/home/sleeve/.claude/history.jsonl", "/home/sleeve/.claude/projects"

    def saved() -> bool:
        grep = 'grep -lF "$1" "$2" "$3"/-workspace/*.jsonl'
        found = lch.exec(sleeve, "sh", "-c", grep, "sh", prompt, history, projects, check=False)
        files = found.stdout.splitlines()
        return history in files and any(f.startswith(projects) for f in files)

    wait_for(saved, 15, what="the prompt in history.jsonl and in the conversation in projects/")
    lch.engine.docker("rm", "-f", sleeve.container)
    again = lch.run("--slot", "1", cli="claude-code")
    assert again.container == sleeve.container
    status = wait_for(lambda: again.cli_up("claude-code"), 20, what="claude-code running again")
    assert status["current_task"] == GOAL
    assert (
        lch.exec(again, "test", "-f", "/workspace/.cstack/CURRENT.md", check=False).returncode == 0
    )
    history = lch.exec(again, "cat", "/home/sleeve/.claude/history.jsonl").stdout
    assert prompt in history
    assert "--continue" in processes(lch, again)[status["cli_pid"]][1]


# --- sleeves that end ---------------------------------------------------------------------


@pytest.fixture
def shell_launcher(
    engine: dockerenv.Engine, image: str, stub: AnthropicStub, tmp_path: Path
) -> Iterator[Launcher]:
    lch = new_launcher(engine, stub, tmp_path)
    yield lch
    remove_started(lch)


def test_docker_kill_and_docker_rm_show_as_failed_code_137_and_vanished_in_sleeve_ps(
    shell_launcher: Launcher,
) -> None:
    lch = shell_launcher
    lch.create_slot(seed_claude=False)
    lch.create_slot(seed_claude=False)
    killed = lch.run("--slot", "1", cli="shell")
    removed = lch.run("--slot", "2", cli="shell")
    assert killed.slot != removed.slot
    lch.engine.docker("kill", killed.container)
    lch.engine.docker("rm", "-f", removed.container)
    by_slot = {r["slot"]: r["status"] for r in lch.ps()}
    assert by_slot[killed.slot] == "failed (code 137)"
    assert by_slot[removed.slot] == "failed (vanished)"
    text = lch("ps").stdout
    assert "failed (code 137)" in text and "failed (vanished)" in text


def test_docker_stop_exits_0_within_the_grace_period_and_current_md_says_killed(
    shell_launcher: Launcher,
) -> None:
    lch = shell_launcher
    sleeve = lch.run("--goal", GOAL, cli="shell")
    current = lch.project / ".cstack" / "CURRENT.md"
    wait_for(current.exists, 10, what="CURRENT.md written from SLEEVE_GOAL")
    grace = 10
    t0 = time.monotonic()
    lch.engine.docker("stop", "--time", str(grace), sleeve.container, timeout=grace + 30)
    elapsed = time.monotonic() - t0
    code = lch.engine.docker("inspect", "--format", "{{.State.ExitCode}}", sleeve.container).stdout
    assert int(code) == 0
    assert elapsed < grace, f"docker stop took {elapsed:.1f} s: SIGTERM was not handled"
    assert "killed" in current.read_text().lower()


# --- bad input ----------------------------------------------------------------------------


def test_sleeve_run_on_a_used_port_fails_clearly_and_starts_nothing(
    shell_launcher: Launcher,
) -> None:
    lch = shell_launcher
    before = lch.engine.docker("ps", "-aq").stdout.split()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = lch(
            "run", "--runtime", "docker", "--network", "host", "--image", "sleeve-e2e:latest",
            "--cli", "shell", "--port", str(port),
        )  # fmt: skip
    assert proc.returncode != 0
    assert str(port) in proc.stderr and "in use" in proc.stderr
    assert lch.engine.docker("ps", "-aq").stdout.split() == before
    assert not [r for r in lch.ps() if r["status"] in ("running", "starting")]


def test_sleeve_run_with_the_slot_credentials_directory_missing_recreates_it(
    shell_launcher: Launcher,
) -> None:
    """A deleted `<slot>/.claude/` on the host must not stop the run, nor become a root-owned
    directory made by Docker: the launcher recreates it privately and the sleeve is healthy."""
    lch = shell_launcher
    folder = lch.create_slot()
    shutil.rmtree(folder / ".claude")
    sleeve = lch.run("--slot", "1", cli="shell")
    assert health_ok(sleeve.port)
    assert (folder / ".claude").is_dir()
    assert (folder / ".claude").stat().st_mode & 0o077 == 0
    slots = json.loads(lch("slots", "--json").stdout)["slots"]
    assert slots[0]["state"] == "unauthenticated"
