"""Agent state end to end: `sleeve run --runtime docker` of the built image with the real Claude
Code CLI, whose API stub (on 127.0.0.1) answers a prompt with a Bash tool call. The prompt and
the answer to the permission prompt go through `POST /input`; `/events` shows the sequence, and
`sidecar wait` inside the container sees the states."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.client import ClientError, SidecarClient
from tests.e2e import dockerenv
from tests.e2e.anthropic_stub import AnthropicStub
from tests.e2e.conftest import (
    E2E_TOKEN,
    Launcher,
    Sleeve,
    new_launcher,
    remove_started,
)
from tests.e2e.tool_stub import codex_config, running
from tests.harness import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

COMMAND = "echo E2E-AGENT-RAN | tee e2e-agent.txt"


@pytest.fixture(scope="module")
def bash_stub() -> Iterator[AnthropicStub]:
    with AnthropicStub(bash_command=COMMAND) as stub:
        yield stub


@pytest.fixture
def claude_sleeve(
    engine: dockerenv.Engine, image: str, bash_stub: AnthropicStub, tmp_path: Path
) -> Iterator[tuple[Launcher, Sleeve]]:
    lch = new_launcher(engine, bash_stub, tmp_path)
    folder = lch.create_slot()
    # Manual permission mode, so that the CLI asks before running Bash (REAL-PARTS.md).
    (folder / ".claude").mkdir(exist_ok=True)
    (folder / ".claude" / "settings.json").write_text(
        json.dumps({"permissions": {"defaultMode": "default"}})
    )
    sleeve = lch.run("--slot", "1", cli="claude-code")
    yield lch, sleeve
    remove_started(lch)


def _agent(sleeve: Sleeve) -> dict[str, Any] | None:
    try:
        code, body = sleeve.get("/status")
    except OSError:
        return None
    return body["agent"] if code == 200 else None


def _agent_in(sleeve: Sleeve, state: str, timeout: float) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        agent = _agent(sleeve)
        return agent if agent is not None and agent["state"] == state else None

    return dict(wait_for(check, timeout, what=f"agent {state}"))


def test_prompt_permission_and_approval_through_the_api_in_the_container(
    claude_sleeve: tuple[Launcher, Sleeve], bash_stub: AnthropicStub
) -> None:
    lch, sleeve = claude_sleeve
    idle = _agent_in(sleeve, "idle", 60)
    assert idle["source"] == "hooks" and idle["session_id"]
    seen: list[dict[str, Any]] = []

    def read() -> None:
        with contextlib.suppress(ClientError):
            for event in SidecarClient(sleeve.url, token=E2E_TOKEN).events():
                seen.append(event)

    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: seen, 10, what="the /events stream")
    code, body = sleeve.post("/input", {"text": "run the e2e command"})
    assert code == 202, body
    waiting = _agent_in(sleeve, "waiting", 60)
    assert "Bash" in waiting["reason"] and COMMAND in waiting["reason"], waiting
    # `sidecar wait` inside the container returns at once for a state the agent is in.
    done = lch.exec(sleeve, "sidecar", "wait", "--state", "waiting", "--timeout", "10")
    assert done.stdout.strip() == "waiting"
    # Answered by id through the API: the held PermissionRequest hook takes it.
    listed = wait_for(lambda: sleeve.get("/approvals")[1]["approvals"], 10, what="the request")
    assert listed[0]["tool"] == "Bash" and listed[0]["summary"] == COMMAND, listed
    code, body = sleeve.post(f"/approvals/{listed[0]['id']}", {"decision": "allow"})
    assert code == 200 and body["by"] == "api", body
    waited = lch.exec(sleeve, "sidecar", "wait", "--state", "idle", "--timeout", "60")
    assert waited.returncode == 0, waited.stderr
    assert (lch.project / "e2e-agent.txt").read_text() == "E2E-AGENT-RAN\n"
    assert any("E2E-AGENT-RAN" in r for r in bash_stub.tool_results())
    resolved = [e for e in list(seen) if e.get("type") == "approval-resolved"]
    assert [(e["decision"], e["by"]) for e in resolved] == [("allow", "api")], resolved
    states = [e["state"] for e in list(seen) if e.get("type") == "agent-state"]
    order = iter(states)
    assert all(any(s == w for s in order) for w in ["working", "waiting", "working", "idle"]), (
        states
    )
    # A wait that cannot be met ends with exit code 1.
    missed = lch.exec(sleeve, "sidecar", "wait", "--state", "exited", "--timeout", "1", check=False)
    assert missed.returncode == 1


CODEX_RAN = "echo CODEX-E2E-RAN > codex-e2e.txt"


def test_codex_in_an_image_with_it_prompt_approval_and_the_command_runs(
    engine: dockerenv.Engine, image: str, tmp_path: Path
) -> None:
    """`sleeve build --clis codex`, then `sleeve run --cli codex` of that image against the
    Responses API stub on loopback: idle, a prompt, the approval listed through Codex's own
    PermissionRequest hook and allowed through the API, the command ran in the workspace, idle.
    The stub's address reaches the default egress list as OPENAI_BASE_URL."""
    tag = "sleeve-e2e-codex-agent:latest"
    lch = new_launcher(engine, None, tmp_path)
    with contextlib.ExitStack() as cleanup:
        port = cleanup.enter_context(running(CODEX_RAN))
        cleanup.callback(engine.docker, "rmi", "-f", tag, check=False)
        cleanup.callback(remove_started, lch)
        url = f"http://127.0.0.1:{port}/v1"
        lch.env |= {"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "stub-key"}
        other = os.environ.get("SLEEVE_E2E_CONTEXT")
        context = ["--context", other] if other else []
        built = lch("build", "--image", tag, "--clis", "codex", *context, timeout=900)
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr
        folder = lch.create_slot(seed_claude=False)
        (folder / ".codex").mkdir(exist_ok=True)
        (folder / ".codex" / "config.toml").write_text(
            codex_config(url, "/workspace", "OPENAI_API_KEY")
        )
        sleeve = lch.run("--slot", "1", cli="codex", image=tag)
        idle = _agent_in(sleeve, "idle", 90)
        assert idle["source"] == "hooks", idle
        code, body = sleeve.post("/input", {"text": "run the e2e command", "if_state": ["idle"]})
        assert code == 202, body
        listed = wait_for(lambda: sleeve.get("/approvals")[1]["approvals"], 60, what="approval")
        assert CODEX_RAN in listed[0]["summary"], listed
        code, body = sleeve.post(f"/approvals/{listed[0]['id']}", {"decision": "allow"})
        assert code == 200, body
        wait_for(lambda: (lch.project / "codex-e2e.txt").exists(), 60, what="the command ran")
        _agent_in(sleeve, "idle", 60)
