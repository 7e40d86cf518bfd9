"""The real Codex, Gemini CLI and opencode set up against the loopback tool stub
(`tests.e2e.tool_stub`, the network seam): Codex's user config with the stub as its model
provider and a hook of the user's own, its rollout files; Gemini's user settings, its state dirs
under /run (Gemini reads system settings only from root's directories); opencode's user config;
and the sidecars that run them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.agent.clis.codex import hooks as codex
from sidecar.core.loopback import free_ports
from tests.e2e.tool_stub import codex_config, opencode_config, running
from tests.harness import Sidecar
from tests.tools import cli_bin

RAN = "echo CODEX-RAN > ran.txt"
GEMINI_API_KEY = "stub-gemini-key-0123456789"
OPENCODE_TOKEN = "agent-admin-token-0123456789"  # the API token of opencode_sidecar


@pytest.fixture
def tool_stub() -> Iterator[str]:
    """`tests.e2e.tool_stub` on a loopback port: its base URL for Codex's model provider."""
    with running(RAN) as port:
        yield f"http://127.0.0.1:{port}/v1"


def user_config(
    sc: Sidecar, stub_url: str, *, extra: str = "", key_env: str = "STUB_API_KEY"
) -> None:
    """The user's own ~/.codex/config.toml: the stub as its model provider (its key in
    `key_env`), the workspace trusted, and a hook of their own (trusted by them) that must keep
    running beside ours."""
    home = sc.tmp / "home" / ".codex"
    home.mkdir(parents=True, exist_ok=True)
    sc.workspace.mkdir(parents=True, exist_ok=True)
    hook = {"type": "command", "command": f"echo user-hook >> {sc.tmp / 'user-hook.txt'}"}
    normalized = {**hook, "timeout": 600, "async": False}
    key = f"{home / 'config.toml'}:user_prompt_submit:0:0"
    provider = codex_config(stub_url, str(sc.workspace), key_env, extra)
    (home / "config.toml").write_text(
        f"""{provider}
[[hooks.UserPromptSubmit]]
[[hooks.UserPromptSubmit.hooks]]
type = "command"
command = {json.dumps(hook["command"])}

[hooks.state."{key}"]
trusted_hash = "{codex.trust_hash("UserPromptSubmit", normalized)}"
"""
    )


def codex_sidecar(
    make_sidecar: Callable[..., Sidecar], stub_url: str | None, *, extra: str = "", **env: str
) -> Sidecar:
    binary = cli_bin("codex")
    sc = make_sidecar(cli="codex")
    if stub_url is not None:
        user_config(sc, stub_url, extra=extra)
        sc.env_extra["STUB_API_KEY"] = "stub-key"
    sc.env_extra.update(PATH=f"{binary.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", **env)
    return sc


def rollout(sc: Sidecar, session: str) -> str:
    found = list((sc.tmp / "home" / ".codex" / "sessions").rglob(f"rollout-*-{session}.jsonl"))
    assert len(found) == 1, found
    return found[0].read_text()


@pytest.fixture
def stub_for() -> Iterator[Callable[[str], str]]:
    """Starts `tests.e2e.tool_stub` answering with a command; gives its base URL."""
    with contextlib.ExitStack() as stack:
        yield lambda command: f"http://127.0.0.1:{stack.enter_context(running(command))}"


@pytest.fixture
def run_dir() -> Iterator[Callable[[], Path]]:
    """State dirs under /run (root's, 0755 all the way up) for the sidecars of one test: where
    Gemini CLI reads system settings from, and out of /tmp, where a guarded CLI could make no
    new entry (`sidecar.egress.fence.crowded_temp`)."""
    made: list[Path] = []

    def make() -> Path:
        if os.geteuid() != 0 or not Path("/run").is_dir():
            pytest.skip("state dirs under /run: root's directories")
        path = Path("/run") / f"sidecar-test-{uuid.uuid4().hex[:12]}"
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def user_home(sc: Sidecar, *, configured: bool = True) -> Path:
    """The CLI user's HOME: with `configured`, Gemini starts at its prompt (API key auth, the
    workspace trusted) and the user has a hook of their own on two events."""
    home = sc.tmp / "home"
    gemini = home / ".gemini"
    gemini.mkdir(parents=True, exist_ok=True)
    if configured:

        def hook(event: str) -> list[dict[str, Any]]:
            mine = f"date +%s.%N-{event} >> {sc.tmp / 'user-hook.txt'}"
            return [{"hooks": [{"type": "command", "command": mine, "name": "mine"}]}]

        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
            "privacy": {"usageStatisticsEnabled": False},
            "hooks": {
                event: hook(event) for event in ("BeforeAgent", "Notification", "AfterAgent")
            },
        }
        (gemini / "settings.json").write_text(json.dumps(settings))
        trusted = {str(sc.workspace): "TRUST_FOLDER"}
        (gemini / "trustedFolders.json").write_text(json.dumps(trusted))
    return home


def gemini_sidecar(
    make_sidecar: Callable[..., Sidecar],
    stub_url: str,
    state_dir: Path | None,
    *,
    configured: bool = True,
    **env: str,
) -> Sidecar:
    sc = make_sidecar(cli="gemini-cli")
    user_home(sc, configured=configured)
    gemini = cli_bin("gemini")
    sc.env_extra.update(
        GEMINI_API_KEY=GEMINI_API_KEY,
        GOOGLE_GEMINI_BASE_URL=stub_url,
        PATH=f"{gemini.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        **env,
    )
    if state_dir is not None:
        sc.env_extra["SIDECAR_STATE_DIR"] = str(state_dir)
    return sc


@pytest.fixture
def chat_stub() -> Iterator[Callable[[str], int]]:
    """Starts `tests.e2e.tool_stub` answering with a command; gives the port."""
    with contextlib.ExitStack() as stack:
        yield lambda command: stack.enter_context(running(command))


def opencode_user_config(stub_port: int) -> dict[str, Any]:
    """The user's own ~/.config/opencode/opencode.json: a provider pointing at the stub, asking
    before bash and edits, and a server port of their own (ours must win, theirs stay unused)."""
    return {**opencode_config(stub_port), "server": {"port": free_ports(1)[0]}}


def opencode_sidecar(
    make_sidecar: Callable[..., Sidecar], stub_port: int | None, binary: Path | None = None
) -> Sidecar:
    """A sidecar running the built-in `opencode` entry (found on PATH), configured by the
    user's own file when `stub_port` is given, with nothing configured otherwise."""
    binary = binary or cli_bin("opencode")
    sc = make_sidecar(cli="opencode")
    if stub_port is not None:
        config = sc.tmp / "home" / ".config" / "opencode" / "opencode.json"
        config.parent.mkdir(parents=True)
        config.write_text(json.dumps(opencode_user_config(stub_port)))
    sc.env_extra.update(
        SIDECAR_TOKEN=OPENCODE_TOKEN,
        OPENCODE_DISABLE_MODELS_FETCH="1",
        OPENCODE_DISABLE_AUTOUPDATE="1",
        PATH=f"{binary.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    )
    return sc
