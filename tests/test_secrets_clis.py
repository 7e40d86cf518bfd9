"""Each real CLI with its API key given as a secret (`SIDECAR_SECRETS_FILE`): the CLI holds only
the placeholder, its requests go through the sidecar's egress proxy over plain HTTP to the
loopback stub of its API, and the stub sees the real key. The stub is listed as `localhost` (a
secret's hosts are names; localhost is 127.0.0.1 here), its base URL `http://localhost:PORT`.
The stubs are the network seam: no real API is reachable from these machines."""

from __future__ import annotations

import json
import secrets
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from sidecar.egress import placeholders
from tests.agenttools import EventLog, claude_env, stub_factory, wait_agent
from tests.clitools import (
    chat_stub,
    codex_sidecar,
    gemini_sidecar,
    opencode_sidecar,
    run_dir,
    user_config,
)
from tests.e2e.anthropic_stub import AnthropicStub, claude_json
from tests.e2e.tool_stub import opencode_config
from tests.harness import Sidecar, http, wait_for

__all__ = ["chat_stub", "run_dir", "stub_factory"]  # the fixtures, imported for pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def with_secret(
    sc: Sidecar, env: str, port: int, *, placeholder: str | None = None, at: Path | None = None
) -> str:
    """`sc` given one secret `api` for the CLI's variable `env`, listed for `localhost` (the
    only host on the allowlist, on `port`), its value from the sidecar's environment; with
    `placeholder`, that one kept in the state dir beforehand. The secrets file goes in `at`
    (made; default the sidecar's tmp dir): the guard keeps a root CLI from creating anything
    directly in the dirs above the file, and a CLI that makes its temporary files in /tmp
    (Gemini CLI's shell, opencode) needs it out of /tmp. The real value."""
    value = "sk-real-" + secrets.token_hex(16)
    entry = {"name": "api", "env": env, "from_env": "SLEEVE_SECRET_API", "hosts": ["localhost"]}
    file = (at or sc.tmp) / "secrets.yaml"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(yaml.safe_dump({"secrets": [entry]}))
    sc.env_extra.pop(env, None)
    sc.env_extra.update(
        SIDECAR_SECRETS_FILE=str(file),
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


def check_sent(port: int, path: str, carried: dict[str, str]) -> None:
    """Each request under `path` that the tool stub on `port` answered carried its key as
    `carried` (header or `?key` -> the value), and there were two at least: the command's
    call and the answer."""
    code, seen = http("GET", f"http://127.0.0.1:{port}/stub/keys")
    assert code == 200, seen
    sent = [{k: v for k, v in s.items() if k != "path"} for s in seen if s["path"].startswith(path)]
    assert len(sent) >= 2, seen
    assert sent == [carried] * len(sent)


def claude_with_secret(
    make_sidecar: Callable[..., Sidecar],
    run_dir: Callable[[], Path],
    stub: AnthropicStub,
    placeholder: str | None,
) -> tuple[Sidecar, str]:
    """A sidecar (not started) running the real Claude Code against `stub` as `localhost`,
    ANTHROPIC_API_KEY a secret; the real value. Its state dir and secrets file are out of /tmp:
    Claude Code makes /tmp/claude-UID at its first start on a machine (test_egress_claude)."""
    sc = make_sidecar(cli="claude-code")
    sc.env_extra.update(claude_env(sc, stub), SIDECAR_STATE_DIR=str(run_dir()))
    port = int(stub.url.rsplit(":", 1)[1])
    sc.env_extra["ANTHROPIC_BASE_URL"] = f"http://localhost:{port}"
    return sc, with_secret(sc, "ANTHROPIC_API_KEY", port, placeholder=placeholder, at=run_dir())


def test_claude_code_turn_with_only_a_placeholder_key(
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
) -> None:
    """Prompt -> Bash tool (approved through the API) -> answer. Claude Code asks once whether
    to use a custom API key from its environment and remembers the answer by the key's last 20
    characters: the home approves the placeholder's. It is kept in the state dir beforehand,
    which the sidecar allows (`placeholders.load` keeps any placeholder of the secret's shape:
    the same path by which a kept state dir gives a new container the same one)."""
    stub = stub_factory(bash_command="echo SECRET-TURN-RAN | tee ran.txt")
    placeholder = placeholders.make("api")
    sc, value = claude_with_secret(make_sidecar, run_dir, stub, placeholder)
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
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    stub_factory: Callable[..., AnthropicStub],
) -> None:
    """Nothing configured away: a home past onboarding that never approved this key. Claude
    Code asks whether to use the key it found in its environment (the placeholder); the sidecar
    reports that as `waiting` like any first-start dialog, and it is answered through the API.
    The answer is remembered by the key's last 20 characters: the placeholder, kept in the state
    dir, is the same after the sidecar starts again, and the question is not asked again."""
    stub = stub_factory()
    sc, value = claude_with_secret(make_sidecar, run_dir, stub, None)
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


def approved_turn(sc: Sidecar, ran: str, keys: tuple[str, ...] = ()) -> None:
    """From the idle prompt: a prompt, the command the stub answers it with allowed (through
    /approvals, or by `keys` where only keys answer the CLI's confirmation), the command's
    output `ran` in ran.txt, the turn's end."""

    def ready_or_gone(s: dict[str, Any]) -> bool:
        return bool(s["agent"]["state"] == "idle" or s["cli_exit_code"] is not None)

    started = sc.wait_status(ready_or_gone, "its prompt (or its exit)", 60)
    assert started["agent"]["state"] == "idle", (started["agent"], started["cli_exit_code"])
    assert sc.post("/input", {"text": "run it", "if_state": ["idle"]}).status == 202
    if keys:
        wait_agent(sc, "waiting", 60)
        assert sc.post("/input", {"keys": list(keys), "if_state": ["waiting"]}).status == 202
    else:
        listed = wait_for(lambda: sc.get("/approvals")[1]["approvals"], 60, what="the approval")
        assert sc.post(f"/approvals/{listed[0]['id']}", {"decision": "allow"}).status == 200
    wait_agent(sc, "idle", 60)
    assert (sc.workspace / "ran.txt").read_text() == f"{ran}\n"


def check_placeholder(sc: Sidecar, state: Path, process: str, env: str, value: str) -> None:
    """The CLI's process `process` was started with `env` set to the placeholder kept in the
    state dir `state`, and the real value in none of its variables."""
    placeholder = json.loads((state / "placeholders.json").read_text())["api"]
    environ = cli_environ(sc, process)
    assert environ[env] == placeholder
    assert not any(value in v for v in environ.values())


def test_codex_turn_with_only_a_placeholder_key(
    make_sidecar: Callable[..., Sidecar], chat_stub: Callable[[str], int]
) -> None:
    """Codex's model provider reads its key from OPENAI_API_KEY (`env_key`) and sends it as a
    Bearer token: prompt -> command approved through the API -> answer."""
    port = chat_stub("echo CODEX-SECRET-RAN > ran.txt")
    sc = codex_sidecar(make_sidecar, None)
    user_config(sc, f"http://localhost:{port}/v1", key_env="OPENAI_API_KEY")
    (sc.tmp / "user-hook.txt").touch()  # the user's hook appends to it
    value = with_secret(sc, "OPENAI_API_KEY", port)
    sc.start()
    approved_turn(sc, "CODEX-SECRET-RAN")
    check_placeholder(sc, sc.state_dir, "codex", "OPENAI_API_KEY", value)
    check_sent(port, "/v1/responses", {"authorization": f"Bearer {value}"})


def test_gemini_cli_turn_with_only_a_placeholder_key(
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    chat_stub: Callable[[str], int],
) -> None:
    """Gemini CLI sends GEMINI_API_KEY as `x-goog-api-key`: prompt -> command confirmed by
    keys -> answer. Its proxy client (undici's EnvHttpProxyAgent, proxyTunnel on) sends even
    these http:// requests through a CONNECT tunnel: the proxy rewrites the plain HTTP in it."""
    port = chat_stub("echo GEMINI-SECRET-RAN > ran.txt")
    state = run_dir()
    sc = gemini_sidecar(make_sidecar, f"http://localhost:{port}", state)
    (sc.tmp / "user-hook.txt").touch()  # the user's hooks append to it
    value = with_secret(sc, "GEMINI_API_KEY", port, at=run_dir())
    sc.start()
    approved_turn(sc, "GEMINI-SECRET-RAN", keys=("1",))
    check_placeholder(sc, state, "node", "GEMINI_API_KEY", value)
    check_sent(port, "/v1beta/models/", {"x-goog-api-key": value})


def opencode_with_secret(
    make_sidecar: Callable[..., Sidecar], run_dir: Callable[[], Path], port: int
) -> tuple[Sidecar, Path, str]:
    """A sidecar (not started) running the real opencode against the chat stub on `port`, its
    provider's key a secret (`{env:STUB_API_KEY}` in its config); its state dir, the value."""
    sc = opencode_sidecar(make_sidecar, None)
    config = opencode_config(port)
    options = {"baseURL": f"http://localhost:{port}/v1", "apiKey": "{env:STUB_API_KEY}"}
    config["provider"]["stub"]["options"] = options
    path = sc.tmp / "home" / ".config" / "opencode" / "opencode.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    value = with_secret(sc, "STUB_API_KEY", port, at=run_dir())
    # opencode (Bun) writes its native libraries to /tmp at start; the guard lets a root CLI
    # create nothing directly in a directory above the state dir, so the state dir is not
    # under /tmp here (the default, /run/sidecar, is not either).
    state = run_dir()
    sc.env_extra["SIDECAR_STATE_DIR"] = str(state)
    return sc, state, value


def test_opencode_turn_with_only_a_placeholder_key(
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    chat_stub: Callable[[str], int],
) -> None:
    """opencode's provider takes its key from the environment and sends it as a Bearer token:
    prompt -> command approved through the API -> answer. Its TUI reaches its own server (on
    the port the sidecar picked for this launch) around the proxy, past the guard."""
    port = chat_stub("echo OPENCODE-SECRET-RAN > ran.txt")
    sc, state, value = opencode_with_secret(make_sidecar, run_dir, port)
    sc.start()
    approved_turn(sc, "OPENCODE-SECRET-RAN")
    check_placeholder(sc, state, "opencode", "STUB_API_KEY", value)
    check_sent(port, "/v1/chat/completions", {"authorization": f"Bearer {value}"})


def test_opencode_reaches_its_own_server_and_no_other_loopback_port(
    run_dir: Callable[[], Path],  # first: removed after the sidecar is gone
    make_sidecar: Callable[..., Sidecar],
    chat_stub: Callable[[str], int],
) -> None:
    """While opencode runs, the guard lets its processes reach the proxy, the API and its own
    server's port alone: a command it runs connects to another loopback port that listens and
    gets EACCES (13); nothing reaches that listener; the refusal is counted."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        other.setblocking(False)
        other_port = other.getsockname()[1]
        probe = (
            f"c = __import__('socket').socket(); print(c.connect_ex(('127.0.0.1', {other_port})))"
        )
        port = chat_stub(f'{sys.executable} -c "{probe}" > ran.txt')
        sc, _state, _value = opencode_with_secret(make_sidecar, run_dir, port)
        sc.start()
        approved_turn(sc, "13")
        with pytest.raises(BlockingIOError):
            other.accept()  # nothing came
    argv = psutil.Process(sc.status()["cli_pid"]).cmdline()  # the guard's
    own, api = f"127.0.0.1:{argv[argv.index('--port') + 1]}", sc.url.removeprefix("http://")
    environ = cli_environ(sc, "opencode")
    proxy = environ["HTTP_PROXY"].removeprefix("http://")
    assert {argv[i + 1] for i, arg in enumerate(argv) if arg == "--allow"} == {proxy, api, own}
    assert environ["NO_PROXY"].split(",") == [api, own]
    assert sc.get("/egress")[1]["denied"] >= 1
