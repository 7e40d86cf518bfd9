"""The dashboard's permission-request cards in a real headless Chromium against a real sidecar:
the real Claude Code asks to run a command (the loopback API stub is the network seam), a view
token sees the card without buttons, a writer clicks Allow and the command runs; a click that
comes too late says who answered first; a command's markup and bidi controls stay visible text."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub
from tests.e2e.cdp import Browser, fresh_artifact
from tests.harness import Sidecar, wait_for
from tests.standin import HeldHook, waiting_sidecar

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = pytest.mark.browser
TOKEN = "dash-approvals-writer-0123456789"
VIEW_TOKEN = "dash-approvals-viewer-0123456789"

CARDS_JS = """
JSON.stringify([...document.querySelectorAll('#approvals .approval')].map(card => ({
  id: card.dataset.id,
  tool: card.querySelector('.tool').textContent,
  since: card.querySelector('.since').textContent,
  command: card.querySelector('.command').textContent,
  buttons: [...card.querySelectorAll('button')].map(b => b.dataset.answer),
  injected: card.querySelectorAll('img, b, script').length,
})))
"""
NOTE_JS = "document.getElementById('approvals-note').textContent"


async def cards(browser: Browser, needles: list[str], timeout: float = 15) -> list[dict]:
    return list(json.loads(await browser.wait_for_text(CARDS_JS, needles, timeout)))


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_allow_clicked_on_the_card_runs_the_real_claude_codes_command(
    chromium: str,
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
    tmp_path: Path,
) -> None:
    command = "touch clicked.txt"
    stub = stub_factory(bash_command=command)
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub), SIDECAR_TOKEN=TOKEN, SIDECAR_VIEW_TOKEN=VIEW_TOKEN)
    sc.start()
    events = EventLog(sc, TOKEN)
    wait_agent(sc, "idle")
    code, body = sc.post("/input", {"text": "please touch the file", "if_state": ["idle"]})
    assert code == 202, body
    requested = events.wait(lambda e: e["type"] == "approval-requested", "approval-requested")
    assert requested["summary"] == command

    shot = fresh_artifact("dashboard-approval.png")
    browser = await Browser.start(chromium, tmp_path / "profile", (1200, 800))
    try:
        # A view token: the card, read-only.
        await browser.open(f"{sc.url}/?token={VIEW_TOKEN}")
        [seen] = await cards(browser, [command, "waiting "])
        assert (seen["id"], seen["tool"], seen["command"]) == (requested["id"], "Bash", command)
        assert "since" in seen["since"]
        # The page knows it is a viewer once /status says so; still no buttons then.
        await browser.wait_for_text("String(document.body.dataset.access)", ["viewer"], 10)
        assert json.loads(await browser.evaluate(CARDS_JS))[0]["buttons"] == []
        assert not (sc.workspace / "clicked.txt").exists()

        # A writer token: Allow, Always allow, Deny; a click on Allow answers the hook.
        await browser.open(f"{sc.url}/?token={TOKEN}")
        await cards(browser, [command, "allow", "always-allow", "deny"])
        await browser.screenshot(shot)
        await browser.evaluate(
            "document.querySelector('#approvals .approval button[data-answer=allow]').click()"
        )
        wait_for(lambda: (sc.workspace / "clicked.txt").exists(), 30, what="clicked.txt")
        await browser.wait_for_text(
            "String(document.querySelectorAll('#approvals .approval').length)", ["0"], 15
        )
        note = await browser.wait_for_text(NOTE_JS, ["allowed by"], 5)
    finally:
        await browser.close()
    resolved = events.wait(lambda e: e["type"] == "approval-resolved", "approval-resolved")
    assert (resolved["id"], resolved["decision"], resolved["by"]) == (
        requested["id"],
        "allow",
        "api",
    )
    assert command in note
    wait_agent(sc, "idle")
    assert sc.get("/approvals")[1] == {"approvals": []}


async def test_a_late_click_names_who_answered_and_commands_stay_text(
    chromium: str, make_sidecar: Callable[..., Sidecar], short_tmp: Path, tmp_path: Path
) -> None:
    """The stand-in CLI's requests (Claude Code's hook, held by the sidecar): a command with
    markup, a bidi override and an escape is shown whole, its hidden characters as \\u escapes;
    Deny with a message reaches the hook; a click on a card answered meanwhile through the API
    (the button kept from before the card went) gets 409 and the page names `by: api`."""
    tricky = "echo <img src=x onerror=alert(1)> <b>x</b> \u202egnp.exe \x1b[2J"
    sc = waiting_sidecar(make_sidecar, short_tmp, tricky, SIDECAR_TOKEN=TOKEN)
    [first] = sc.get("/approvals")[1]["approvals"]
    denied = HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": "make clean"}})
    browser = await Browser.start(chromium, tmp_path / "profile", (1200, 800))
    try:
        await browser.open(f"{sc.url}/?token={TOKEN}")
        shown = await cards(browser, ["make clean", "<img src=x", "deny"])
        card = next(c for c in shown if c["id"] == first["id"])
        assert card["command"] == tricky.replace("\u202e", "\\u202E").replace("\x1b", "\\u001B")
        assert all(c["injected"] == 0 for c in shown)

        # Deny, with a message to the agent.
        await browser.evaluate(
            """(() => {
              const card = [...document.querySelectorAll('#approvals .approval')]
                .find(c => c.textContent.includes('make clean'));
              card.querySelector('input').value = 'not now';
              card.querySelector('button[data-answer=deny]').click();
            })()"""
        )
        denied.thread.join(10)
        assert denied.reply is not None
        decision = denied.reply.body["hookSpecificOutput"]["decision"]
        assert decision == {"behavior": "deny", "message": "not now"}

        # Answered through the API behind the page's back; the page's button clicked after.
        await browser.evaluate(
            f'window.late = document.querySelector(\'.approval[data-id="{first["id"]}"] '
            "button[data-answer=allow]')"
        )
        assert sc.post(f"/approvals/{first['id']}", {"decision": "deny"})[0] == 200
        await browser.wait_for_text(
            "String(document.querySelectorAll('#approvals .approval').length)", ["0"], 15
        )
        await browser.evaluate("window.late.click()")
        note = await browser.wait_for_text(NOTE_JS, ["answered already"], 10)
    finally:
        await browser.close()
    assert note.endswith("answered already: denied by api"), note
