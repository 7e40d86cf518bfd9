"""Agent state with the real Gemini CLI (0.61.0) in real tmux, talking to the loopback Gemini API
stub (`tests.e2e.tool_stub`: a prompt gets a shell call, the tool result a line of text). Its
hooks report through `sidecar.agent.hook_relay`; its confirmation is answered by keys (Gemini has no
hook that decides one).

Gemini reads the sidecar's settings (system defaults) only from a directory that root owns and
nobody else may write, so these sidecars keep their state under /run, not the test's tmp dir;
the one that keeps it in tmp shows the fallback when the CLI rejects that file.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.client import ClientError
from tests.agenttools import EventLog, cli_argv, showing, wait_agent
from tests.clitools import gemini_sidecar, run_dir, stub_for  # run_dir, stub_for: fixtures
from tests.harness import Sidecar, http, wait_for

__all__ = ["run_dir", "stub_for"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
TOKEN = "agent-admin-token-0123456789"
HOOK = "/hooks/gemini-cli"


def user_hook_times(sc: Sidecar, event: str) -> list[float]:
    path = sc.tmp / "user-hook.txt"
    lines = path.read_text().split() if path.exists() else []
    return [float(t) for t, _, e in (line.partition("-") for line in lines) if e.endswith(event)]


def test_prompt_permission_keys_and_idle_with_the_real_gemini_cli(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """idle -> prompt via /input -> working -> waiting (Shell and its command) -> "1" via
    /input -> working -> idle; the command ran; /events has the sequence; the user's own hooks
    ran beside ours; an inbox notice is typed at the prompt (and its tool call denied by keys).
    The sidecar runs as in a CI job (CI=true, GITHUB_ACTIONS=true), which on its own would make
    Gemini headless: it gets "1" for both, and so does the command it runs."""
    marker_cmd = 'echo "GEMINI-RAN $CI" | tee ran.txt'
    state = run_dir()
    sc = gemini_sidecar(
        make_sidecar,
        stub_for(marker_cmd),
        state,
        SIDECAR_TOKEN=TOKEN,
        CI="true",
        GITHUB_ACTIONS="true",
    ).start()
    events = EventLog(sc, TOKEN)
    first = wait_agent(sc, "idle", 60)
    assert first["source"] == "hooks"
    session = first["session_id"]
    assert session and len(session) == 36
    cli = psutil.Process(sc.status()["cli_pid"])
    assert cli.cmdline()[-2:] == ["--session-id", session]
    assert {k: cli.environ().get(k) for k in ("CI", "GITHUB_ACTIONS")} == dict.fromkeys(
        ("CI", "GITHUB_ACTIONS"), "1"
    )

    code, body = sc.post("/input", {"text": "please run the command", "if_state": ["idle"]})
    assert code == 202 and body["delivered"] is True, body
    waiting = wait_agent(sc, "waiting")
    assert waiting["reason"] == f"Shell: {marker_cmd}", waiting
    code, body = sc.post("/input", {"keys": ["1"], "if_state": ["waiting"]})
    assert code == 202, body
    wait_agent(sc, "idle")
    assert (sc.workspace / "ran.txt").read_text() == "GEMINI-RAN 1\n"
    events.wait_states(["idle", "working", "waiting", "working", "idle"])
    waits = [e for e in events.of("agent-state") if e["state"] == "waiting"]
    assert waits[0]["previous"] == "working" and marker_cmd in waits[0]["reason"]
    # The user's hooks ran beside ours, once per event; their settings were not written to.
    for event in ("BeforeAgent", "Notification", "AfterAgent"):
        assert len(user_hook_times(sc, event)) == 1, event
    user = json.loads((sc.tmp / "home" / ".gemini" / "settings.json").read_text())
    assert [h["name"] for h in user["hooks"]["BeforeAgent"][0]["hooks"]] == ["mine"]
    ours = state / "gemini-cli-hooks.json"
    assert ours.stat().st_mode & 0o777 == 0o600
    assert not [w for w in sc.status()["warnings"] if "hook" in w]
    assert sc.status()["agent"]["session_id"] == session

    # An inbox notice is typed at the idle prompt; the stub answers it with the command again,
    # which is denied by keys this time: back at the prompt, the command not run again.
    (sc.workspace / "ran.txt").unlink()
    code, _ = sc.post("/inbox", {"from": "envoy", "type": "task", "content": "look at this"})
    assert code == 201
    notified = events.wait(lambda e: e["type"] == "inbox-notified", "an inbox notice")
    wait_agent(sc, "waiting")
    screen = "\n".join(sc.get("/screen")[1]["lines"])
    assert notified["text"][:40] in screen
    assert sc.post("/input", {"keys": ["3"], "if_state": ["waiting"]})[0] == 202
    wait_agent(sc, "idle")
    assert not (sc.workspace / "ran.txt").exists()


def events_with_arrival(events: EventLog) -> list[tuple[float, dict[str, Any]]]:
    return [(e["_arrived"], e) for e in events.of("agent-state") if "_arrived" in e]


class TimedEventLog(EventLog):
    """An EventLog that stamps each line with the time it arrived."""

    def _read(self) -> None:
        try:
            for event in self.client.events():
                self.lines.append({**event, "_arrived": time.time()})
        except ClientError:
            pass


def test_hook_to_events_latency(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """Three turns (each: prompt, confirmation denied by keys): the time from the user's hook,
    which Gemini runs side by side with ours for the same event, to the agent-state line's
    arrival on /events."""
    sc = gemini_sidecar(make_sidecar, stub_for("touch stub-was-here"), run_dir()).start()
    events = TimedEventLog(sc)
    wait_agent(sc, "idle", 60)
    for turn in range(3):
        assert sc.post("/input", {"text": f"turn {turn}", "if_state": ["idle"]})[0] == 202
        # The tool's confirmation, not another screen read as a dialog (run60 read the
        # start's tips as one: "2. /help for more information", and the turn never ran).
        waiting = wait_agent(sc, "waiting")
        assert waiting["reason"] == "Shell: touch stub-was-here", showing(sc)
        assert sc.post("/input", {"keys": ["3"], "if_state": ["waiting"]})[0] == 202
        wait_agent(sc, "idle")
    arrivals = events_with_arrival(events)
    samples = []
    for event, state in (("BeforeAgent", "working"), ("Notification", "waiting")):
        for started in user_hook_times(sc, event):
            after = [t for t, e in arrivals if e["state"] == state and t >= started - 0.5]
            samples.append(min(after) - started)
    hooks = (sc.tmp / "user-hook.txt").read_text()
    assert len(samples) == 6, f"the user's hook ran at:\n{hooks}\nthe states came: {arrivals}"
    print(f"gemini hook -> agent-state: median {statistics.median(samples) * 1000:.0f} ms, "
          f"max {max(samples) * 1000:.0f} ms: {[round(s * 1000) for s in samples]}")  # fmt: skip
    assert statistics.median(samples) < 2.0


def test_resleeve_and_restart_resume_the_same_session_id(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """The pinned --session-id is resumed (--resume <id>) after a resleeve, after a resleeve
    to another CLI and back, and after the sidecar itself was stopped and started again; the
    stop leaves none of Gemini's node processes behind."""
    sc = gemini_sidecar(make_sidecar, stub_for("touch stub-was-here"), run_dir()).start()
    session = wait_agent(sc, "idle", 60)["session_id"]
    assert cli_argv(sc)[-2:] == ["--session-id", session]
    assert sc.post("/input", {"text": "remember this"})[0] == 202
    wait_agent(sc, "waiting")
    assert sc.post("/input", {"keys": ["1"], "if_state": ["waiting"]})[0] == 202
    wait_agent(sc, "idle")
    # Gemini 0.61 starts a conversation over when it is resumed within the minute its file is
    # named after (a second record in the same file): the first resume waits for the next one.
    (named,) = (sc.tmp / "home" / ".gemini" / "tmp").glob(f"*/chats/session-*-{session[:8]}.*")
    minute = named.name.removeprefix("session-")[:16]
    wait_for(lambda: time.strftime("%Y-%m-%dT%H-%M", time.gmtime()) != minute, 65, what="a minute")

    def resumed(cli: str = "gemini-cli") -> None:
        code, body = sc.post("/resleeve", {"cli": cli})
        assert code == 202, body
        sc.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved", 60)

    def gemini_nodes() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            ours = ".bin/gemini" in cmd or "gemini-cli/bundle" in cmd
            if ours and str(sc.workspace) in " ".join(proc_cwd(proc)):
                found.append(proc)
        return found

    resumed()
    assert wait_agent(sc, "idle", 60)["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]
    resumed("shell")
    assert sc.status()["agent"]["source"] == "activity"
    wait_for(
        lambda: not gemini_nodes(),
        15,
        what=lambda: (
            f"no Gemini process after the resleeve: {[p.cmdline() for p in gemini_nodes()]}"
        ),
    )
    resumed()
    assert wait_agent(sc, "idle", 60)["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]

    assert sc.stop() == 0
    assert not gemini_nodes()
    sc.start()
    assert wait_agent(sc, "idle", 60)["session_id"] == session
    assert cli_argv(sc)[-2:] == ["--resume", session]


def proc_cwd(proc: psutil.Process) -> list[str]:
    try:
        return [proc.cwd()]
    except psutil.Error:
        return []


def test_first_start_screens_are_waiting_never_idle(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """A HOME with nothing configured: the trust dialog, then (answered) the auth choice, read
    as `waiting` with the dialog's question, never `idle`. (Before the trust dialog Gemini may
    show its "Waiting for authentication..." spinner for a moment, longer on a loaded machine:
    that reads `waiting` too, so the test waits for the trust dialog's own reason.)"""
    sc = gemini_sidecar(
        make_sidecar, stub_for("touch stub-was-here"), run_dir(), configured=False
    ).start()
    events = EventLog(sc)
    trust = sc.wait_status(
        lambda s: "trust" in (s["agent"]["reason"] or "").lower(), "the trust dialog", 60
    )["agent"]
    assert trust["state"] == "waiting", trust
    assert sc.post("/input", {"keys": ["1"], "if_state": ["waiting"]})[0] == 202
    auth = sc.wait_status(
        lambda s: "authenticate" in (s["agent"]["reason"] or ""), "the auth choice", 60
    )["agent"]
    assert auth["state"] == "waiting"
    assert "idle" not in events.states()


def test_wrong_hook_secret_is_refused_and_changes_nothing(
    run_dir: Callable[[], Path],  # first: removed after the sidecars are gone
    make_sidecar: Callable[..., Sidecar],
    stub_for: Callable[[str], str],
) -> None:
    """A forged Notification (no secret, a wrong one, the API token): 403, state and /events
    untouched; the relay with the right file still gets through."""
    state = run_dir()
    sc = gemini_sidecar(
        make_sidecar, stub_for("touch stub-was-here"), state, SIDECAR_TOKEN=TOKEN
    ).start()
    wait_agent(sc, "idle", 60)
    events = EventLog(sc, TOKEN)
    secret = json.loads((state / "gemini-cli-hooks.json").read_text())["sidecar"]["headers"]
    payload = json.dumps(
        {"notification_type": "ToolPermission", "details": {"type": "exec", "command": "rm -rf /"}}
    ).encode()
    for headers in ({}, {"X-Sidecar-Hook": "wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
        code, body = http("POST", f"{sc.url}{HOOK}/Notification", headers=headers, raw=payload)
        assert code == 403, (headers, code, body)
    assert sc.status()["agent"]["state"] == "idle"
    assert events.of("agent-state") == []
    code, _ = http("POST", f"{sc.url}{HOOK}/Notification", headers=secret, raw=payload)
    assert code == 204
    assert wait_agent(sc, "waiting")["reason"] == "Shell: rm -rf /"


def test_rejected_hook_config_falls_back_to_screen_and_activity(
    make_sidecar: Callable[..., Sidecar], stub_for: Callable[[str], str]
) -> None:
    """State kept under the test's tmp dir (under /tmp, writable by all): Gemini skips our
    settings file, no hook reports; after the silence the state comes from the screen and the
    pane's activity, /status says so, and a turn still reads working, waiting, idle."""
    sc = gemini_sidecar(make_sidecar, stub_for("touch stub-was-here"), None).start()
    status = sc.wait_status(
        lambda s: any("no hook reported" in w for w in s["warnings"]),
        "the silent-hooks warning",
        60,
    )
    assert any("no hook reported" in w for w in status["warnings"]), status["warnings"]
    assert status["agent"]["source"] == "activity"
    wait_agent(sc, "idle", 30)
    events = EventLog(sc)
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]})[0] == 202
    assert "Shell: touch stub-was-here" in wait_agent(sc, "waiting")["reason"]
    assert sc.post("/input", {"keys": ["1"], "if_state": ["waiting"]})[0] == 202
    wait_agent(sc, "idle", 30)
    events.wait_states(["working", "waiting", "idle"])
