"""Helpers for the agent-state tests: the real Claude Code CLI set up to run offline against the
loopback API stub, an /events reader that keeps every line it saw, the wait for a state, the
running CLI's argv, and the supervisor's once-a-second tick seen on /events."""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.client import ClientError, SidecarClient
from tests.e2e.anthropic_stub import TEST_API_KEY, AnthropicStub, claude_json
from tests.harness import Sidecar, wait_for
from tests.tools import missing

CLAUDE = Path(sys.executable).parent / "claude"  # scripts/setup --test puts it in the venv


def claude_binary() -> Path:
    if not CLAUDE.exists():
        missing(f"Claude Code is not installed at {CLAUDE} (scripts/setup --test installs it)")
    return CLAUDE


def claude_env(sc: Sidecar, stub: AnthropicStub) -> dict[str, str]:
    """A HOME where the real CLI starts straight at its prompt, in manual permission mode (so
    that it asks before running Bash), talking to `stub`."""
    home = sc.tmp / "home"
    (home / ".claude").mkdir(parents=True, exist_ok=True)
    (home / ".claude.json").write_text(json.dumps(claude_json(str(sc.workspace))))
    # The user's own settings, with a hook of their own: ours must not replace it.
    user_hook = f"echo user-hook >> {sc.tmp / 'user-hook.txt'}"
    settings = {
        "permissions": {"defaultMode": "default"},
        "hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": user_hook}]}]},
    }
    (home / ".claude" / "settings.json").write_text(json.dumps(settings))
    return {
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": TEST_API_KEY,
        "DISABLE_AUTOUPDATER": "1",
        "PATH": f"{claude_binary().parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }


def claude_sidecar(
    make_sidecar: Callable[..., Sidecar], stub: AnthropicStub, *, trusted: bool = True, **env: str
) -> Sidecar:
    """A sidecar (not started) running the real Claude Code against `stub` (`claude_env`), with
    `env` added; not `trusted`: a user's home past onboarding where this workspace was never
    trusted, so the CLI starts at its trust dialog."""
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub), **env)
    if not trusted:
        state = sc.tmp / "home" / ".claude.json"
        config = json.loads(state.read_text())
        config["projects"] = {}
        state.write_text(json.dumps(config))
    return sc


class EventLog:
    """Every /events line of one stream, read by a thread until the stream ends."""

    def __init__(self, sc: Sidecar | str, token: str | None = None) -> None:
        """`sc`: the sidecar, or the URL of one (in a container)."""
        self.client = SidecarClient(sc if isinstance(sc, str) else sc.url, token)
        self.lines: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        wait_for(lambda: self.lines, 10, what="the first /events line")
        # The stream has no event for the state the agent is in when it begins (a CLI can be
        # idle before this thread subscribes): read once it is live, a transition meanwhile is
        # in both.
        self.initial: str = self.client.status()["agent"]["state"]

    def _read(self) -> None:
        try:
            for event in self.client.events():
                self.lines.append(event)
        except ClientError:
            pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in list(self.lines) if e.get("type") == kind]

    def states(self) -> list[str]:
        """The agent's state when the stream began, then each `agent-state` event's."""
        return [self.initial, *(e["state"] for e in self.of("agent-state"))]

    def wait_states(self, wanted: list[str], timeout: float = 10) -> list[str]:
        """The stream's agent states once `wanted` is among them in order (the stream is read
        by a thread: /status can say a state before this thread has read its line)."""
        return wait_for(
            lambda: (seen := self.states()) and subsequence(wanted, seen) and seen,
            timeout,
            what=lambda: f"agent states {wanted} on /events (seen: {self.states()})",
        )

    def wait(
        self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 30
    ) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            return next((e for e in list(self.lines) if predicate(e)), None)

        return wait_for(found, timeout, what=what)


def agent_status(sc: Sidecar) -> dict[str, Any]:
    """The agent's part of /status now."""
    return dict(sc.status()["agent"])


def cli_argv(sc: Sidecar) -> list[str]:
    """The running CLI's argv (its pid as /status names it; an npm launcher's is node's, with
    the script and the CLI's arguments after it)."""
    return list(psutil.Process(sc.status()["cli_pid"]).cmdline())


def wait_ticks(sc: Sidecar, events: EventLog, count: int) -> None:
    """Wait until the supervisor's once-a-second tick has run `count` more times. The tick
    that types inbox notices also reports CURRENT.md edits: each of `count` edits seen on
    /events (`progress-update`) is one more tick, and the ticks come a second apart on the
    supervisor's own event loop. For the tests that prove something did NOT happen, the signal
    that it had its chances. Nothing may ask /status meanwhile: it reads CURRENT.md too, and
    would report an edit in a tick's place."""
    current = sc.workspace / ".cstack" / "CURRENT.md"
    current.parent.mkdir(exist_ok=True)
    for _ in range(count):
        task = f"tick {secrets.token_hex(4)}"
        current.write_text(f"# Current\n\n## Task\n{task}\n")

        def reported(e: dict[str, Any], task: str = task) -> bool:
            return e["type"] == "progress-update" and e["task"] == task

        events.wait(reported, f"the tick that reports {task!r}")


def wait_agent(sc: Sidecar, state: str, timeout: float = 30) -> dict[str, Any]:
    """The agent's part of /status once its state is `state`. A wait that times out says what
    the agent and the CLI's screen were at the end, for whoever reads the failure."""

    found = sc.wait_status(
        lambda s: s["agent"]["state"] == state, lambda: f"agent {state}; {showing(sc)}", timeout
    )
    return dict(found["agent"])


def showing(sc: Sidecar) -> str:
    """What the agent is and what the CLI's screen shows now (with its cursor), for a failure's
    message."""
    agent = sc.status()["agent"]
    code, screen = sc.get("/screen")
    if code != 200:
        return f"the agent was {agent}; the screen ({code}): {screen}"
    text = "\n".join(screen["lines"]).rstrip()
    return f"the agent was {agent}; the screen (cursor {screen.get('cursor')}):\n{text}"


def subsequence(wanted: list[str], seen: list[str]) -> bool:
    """Whether `wanted` appears in `seen` in order (other items may come between)."""
    it: Iterator[str] = iter(seen)
    return all(any(w == s for s in it) for w in wanted)


@pytest.fixture
def stub_factory() -> Iterator[Callable[..., AnthropicStub]]:
    made: list[AnthropicStub] = []

    def make(**kw: Any) -> AnthropicStub:
        stub = AnthropicStub(**kw).start()
        made.append(stub)
        return stub

    yield make
    for stub in made:
        stub.stop()


def asking(
    make_sidecar: Callable[..., Sidecar],
    stub: AnthropicStub,
    **env: str,
) -> tuple[Sidecar, EventLog, dict[str, object]]:
    """A sidecar whose Claude Code was asked to run the stub's command: the request listed."""
    sc = make_sidecar(cli="claude-code", env_extra=env)
    sc.env_extra.update(claude_env(sc, stub))
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]}).status == 202
    requested = events.wait(lambda e: e["type"] == "approval-requested", "approval-requested")
    return sc, events, requested
