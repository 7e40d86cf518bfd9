"""Each real CLI with its API key given as a secret (`SIDECAR_SECRETS_FILE`): the CLI holds only
the placeholder, its requests go through the sidecar's egress proxy over plain HTTP to the
loopback stub of its API, and the stub sees the real key. The stub is listed as `localhost` (a
secret's hosts are names; localhost is 127.0.0.1 here), its base URL `http://localhost:PORT`.
The stubs are the network seam: no real API is reachable from these machines."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

import psutil
import pytest
import yaml

from sidecar.egress import placeholders
from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.e2e.anthropic_stub import AnthropicStub, claude_json
from tests.harness import Sidecar, wait_for

__all__ = ["stub_factory"]  # the fixture, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def with_secret(sc: Sidecar, env: str, port: int, *, placeholder: str | None = None) -> str:
    """`sc` given one secret `api` for the CLI's variable `env`, listed for `localhost` (the
    only host on the allowlist, on `port`), its value from the sidecar's environment; with
    `placeholder`, that one kept in the state dir beforehand. The real value."""
    value = "sk-real-" + secrets.token_hex(16)
    entry = {"name": "api", "env": env, "from_env": "SLEEVE_SECRET_API", "hosts": ["localhost"]}
    (sc.tmp / "secrets.yaml").write_text(yaml.safe_dump({"secrets": [entry]}))
    sc.env_extra.pop(env, None)
    sc.env_extra.update(
        SIDECAR_SECRETS_FILE=str(sc.tmp / "secrets.yaml"),
        SIDECAR_EGRESS_ALLOW=f"localhost:{port}",
        SLEEVE_SECRET_API=value,
    )
    if placeholder is not None:
        sc.state_dir.mkdir(mode=0o700)
        kept = sc.state_dir / "placeholders.json"
        kept.write_text(json.dumps({"api": placeholder}))
        kept.chmod(0o600)
    return value


def cli_environ(sc: Sidecar, name: str) -> dict[str, str]:
    """The environment the CLI's process `name` (the pid /status names, or a child of it) was
    started with, as /proc/PID/environ shows it."""
    top = psutil.Process(sc.status()["cli_pid"])
    found = [p for p in (top, *top.children(recursive=True)) if p.name() == name]
    assert found, [p.name() for p in (top, *top.children(recursive=True))]
    return dict(found[0].environ())


def claude_with_secret(
    make_sidecar: Callable[..., Sidecar], stub: AnthropicStub, placeholder: str | None
) -> tuple[Sidecar, str]:
    """A sidecar (not started) running the real Claude Code against `stub` as `localhost`,
    ANTHROPIC_API_KEY a secret; the real value."""
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub))
    # The user's hook appends to a file beside the state dir, which a guarded root CLI may not
    # create (as in test_egress_claude).
    (sc.tmp / "user-hook.txt").touch()
    port = int(stub.url.rsplit(":", 1)[1])
    sc.env_extra["ANTHROPIC_BASE_URL"] = f"http://localhost:{port}"
    return sc, with_secret(sc, "ANTHROPIC_API_KEY", port, placeholder=placeholder)


def test_claude_code_turn_with_only_a_placeholder_key(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """Prompt -> Bash tool (approved through the API) -> answer. Claude Code asks once whether
    to use a custom API key from its environment and remembers the answer by the key's last 20
    characters: the home approves the placeholder's. It is kept in the state dir beforehand,
    which the sidecar allows (`placeholders.load` keeps any placeholder of the secret's shape:
    the same path by which a kept state dir gives a new container the same one)."""
    stub = stub_factory(bash_command="echo SECRET-TURN-RAN | tee ran.txt")
    placeholder = placeholders.make("api")
    sc, value = claude_with_secret(make_sidecar, stub, placeholder)
    config = claude_json(str(sc.workspace), api_key=placeholder)
    (sc.tmp / "home" / ".claude.json").write_text(json.dumps(config))
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle", timeout=60)
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]}).status == 202
    requested = events.wait(lambda e: e["type"] == "approval-requested", "approval-requested")
    assert sc.post(f"/approvals/{requested['id']}", {"decision": "allow"}).status == 200
    wait_for(lambda: (sc.workspace / "ran.txt").exists(), 20, what="the command ran")
    wait_agent(sc, "idle")
    assert any("SECRET-TURN-RAN" in r for r in stub.tool_results()), stub.tool_results()

    # The stub saw the real key on every request that carried one, and never the placeholder.
    posts = stub.messages_posts()
    assert len(posts) >= 2  # the tool call and the answer
    keyed = [r for r in stub.requests if "x-api-key" in r.headers]
    assert all(r in keyed for r in posts)
    assert {r.headers["x-api-key"] for r in keyed} == {value}
    assert not any(placeholder in json.dumps(r.headers) for r in stub.requests)
    # The CLI was started with the placeholder only.
    environ = cli_environ(sc, "claude")
    assert environ["ANTHROPIC_API_KEY"] == placeholder
    assert not any(value in v for v in environ.values())
    assert "SLEEVE_SECRET_API" not in environ
    assert json.loads((sc.state_dir / "placeholders.json").read_text()) == {"api": placeholder}


def test_claude_code_asks_about_the_placeholder_key_and_remembers_the_answer(
    make_sidecar: Callable[..., Sidecar], stub_factory: Callable[..., AnthropicStub]
) -> None:
    """Nothing configured away: a home past onboarding that never approved this key. Claude
    Code asks whether to use the key it found in its environment (the placeholder); the sidecar
    reports that as `waiting` like any first-start dialog, and it is answered through the API.
    The answer is remembered by the key's last 20 characters: the placeholder, kept in the state
    dir, is the same after the sidecar starts again, and the question is not asked again."""
    stub = stub_factory()
    sc, value = claude_with_secret(make_sidecar, stub, None)
    config = claude_json(str(sc.workspace))
    config["customApiKeyResponses"] = {"approved": [], "rejected": []}
    (sc.tmp / "home" / ".claude.json").write_text(json.dumps(config))
    sc.start()
    waiting = wait_agent(sc, "waiting", timeout=60)
    assert waiting["reason"] == (
        "Detected a custom API key in your environment: Do you want to use this API key?"
    ), waiting
    placeholder = json.loads((sc.state_dir / "placeholders.json").read_text())["api"]
    # It shows the key's end: the placeholder's, never the value's.
    screen = "\n".join(sc.get("/screen")[1]["lines"])
    assert placeholder[-20:] in screen and value[-20:] not in screen
    code, body = sc.post("/input", {"choice": "Yes", "if_state": ["waiting"]})
    assert code == 202, body
    wait_agent(sc, "idle")

    def approved() -> object:
        remembered = json.loads((sc.tmp / "home" / ".claude.json").read_text())
        return remembered.get("customApiKeyResponses", {}).get("approved")

    # Written as it goes on (a temporary file renamed over it): polled.
    assert wait_for(approved, 10, what="the answer in ~/.claude.json") == [placeholder[-20:]]

    assert sc.stop() == 0
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle", timeout=60)
    assert sc.post("/input", {"text": "hello again", "if_state": ["idle"]}).status == 202
    wait_for(lambda: "hello again" in stub.prompts_seen(), 30, what="the prompt at the stub")
    wait_agent(sc, "idle")
    assert "waiting" not in events.states()
    assert {r.headers.get("x-api-key") for r in stub.messages_posts()} == {value}
