"""Configuration: every bad value exits 2 with one stderr line naming the variable; the pure
parsers are tested directly, the exit behaviour through a real `sidecar run` process."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.agent.registry import load_registry
from sidecar.config import Config, ConfigError, RestartPolicy
from sidecar.core.loopback import free_port
from tests.commands import run_sidecar
from tests.harness import Sidecar, wait_for
from tests.proctools import pane_text

BASE = {"SLEEVE_NAME": "alice", "SLEEVE_CLI": "shell"}


def test_defaults_match_the_contract() -> None:
    cfg = Config.from_env(BASE)
    assert (cfg.port, cfg.host, cfg.ttyd_port) == (8080, "0.0.0.0", None)
    assert cfg.workspace == Path("/workspace")
    assert cfg.state_dir == Path("/run/sidecar")
    assert cfg.paths.tmux_socket == Path("/run/sidecar/tmux.sock")
    # TTYD_PORT unset: ttyd listens on a unix socket in the state dir.
    assert cfg.paths.ttyd_socket == Path("/run/sidecar/ttyd.sock")
    assert cfg.user is None
    assert cfg.restart is RestartPolicy.NO
    assert cfg.stop_grace == 5.0
    assert cfg.token is None and cfg.view_token is None
    assert cfg.recording.on and cfg.record_dir == Path("/run/sidecar/recordings")
    assert cfg.recording.max_bytes == 200 * 1024 * 1024
    assert cfg.budget_usd is None and cfg.budget_tokens is None


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"SLEEVE_CLI": "shell"}, "SLEEVE_NAME"),
        ({"SLEEVE_NAME": "  ", "SLEEVE_CLI": "shell"}, "SLEEVE_NAME"),
        ({"SLEEVE_NAME": "a"}, "SLEEVE_CLI"),
        ({**BASE, "SLEEVE_CLI": ""}, "SLEEVE_CLI"),
        ({**BASE, "SIDECAR_PORT": "80a"}, "SIDECAR_PORT"),
        ({**BASE, "SIDECAR_PORT": "70000"}, "SIDECAR_PORT"),
        ({**BASE, "TTYD_PORT": "-1"}, "TTYD_PORT"),
        ({**BASE, "TTYD_PORT": "8080"}, "TTYD_PORT"),
        ({**BASE, "SIDECAR_HOST": "not a host"}, "SIDECAR_HOST"),
        ({**BASE, "SIDECAR_RESTART": "sometimes"}, "SIDECAR_RESTART"),
        ({**BASE, "SIDECAR_STOP_GRACE": "soon"}, "SIDECAR_STOP_GRACE"),
        ({**BASE, "SIDECAR_STOP_GRACE": "-1"}, "SIDECAR_STOP_GRACE"),
        ({**BASE, "SIDECAR_STOP_GRACE": "nan"}, "SIDECAR_STOP_GRACE"),
        ({**BASE, "SIDECAR_ACTIVITY_QUIET": "fast"}, "SIDECAR_ACTIVITY_QUIET"),
        ({**BASE, "SIDECAR_ACTIVITY_QUIET": "0.1"}, "SIDECAR_ACTIVITY_QUIET"),
        ({**BASE, "SIDECAR_ACTIVITY_QUIET": "inf"}, "SIDECAR_ACTIVITY_QUIET"),
        ({**BASE, "SIDECAR_TOKEN": "same", "SIDECAR_VIEW_TOKEN": "same"}, "SIDECAR_VIEW_TOKEN"),
        ({**BASE, "SIDECAR_RECORD": "maybe"}, "SIDECAR_RECORD"),
        ({**BASE, "SIDECAR_RECORD_DIR": "relative/dir"}, "SIDECAR_RECORD_DIR"),
        ({**BASE, "SIDECAR_RECORD_MAX_MB": "lots"}, "SIDECAR_RECORD_MAX_MB"),
        ({**BASE, "SIDECAR_RECORD_MAX_MB": "0"}, "SIDECAR_RECORD_MAX_MB"),
        ({**BASE, "SIDECAR_BUDGET_USD": "ten dollars"}, "SIDECAR_BUDGET_USD"),
        ({**BASE, "SIDECAR_BUDGET_USD": "-1"}, "SIDECAR_BUDGET_USD"),
        ({**BASE, "SIDECAR_BUDGET_USD": "inf"}, "SIDECAR_BUDGET_USD"),
        ({**BASE, "SIDECAR_BUDGET_TOKENS": "1e6"}, "SIDECAR_BUDGET_TOKENS"),
        ({**BASE, "SIDECAR_BUDGET_TOKENS": "0"}, "SIDECAR_BUDGET_TOKENS"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Config.from_env(env)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SLEEVE_CLI": "shell"}, "SLEEVE_NAME is required"),
        ({"SLEEVE_NAME": "a", "SLEEVE_CLI": ""}, "SLEEVE_CLI is required"),
        ({**BASE, "SIDECAR_PORT": "eighty"}, "SIDECAR_PORT must be an integer"),
        ({**BASE, "SIDECAR_STOP_GRACE": "4000"}, "between 0 and 3600 seconds"),
        ({**BASE, "SIDECAR_ACTIVITY_QUIET": "0.2"}, "between 0.5 and 3600 seconds"),
        ({**BASE, "SIDECAR_ALLOWED_ORIGINS": "evil.example"}, "SIDECAR_ALLOWED_ORIGINS"),
        ({**BASE, "SIDECAR_STATE_DIR": "/proc/sidecar-state"}, "SIDECAR_STATE_DIR"),
        ({**BASE, "SIDECAR_STATE_DIR": "/tmp/" + "d" * 120}, "SIDECAR_STATE_DIR: /tmp/ddd"),
        ({**BASE, "SIDECAR_BUDGET_USD": "a lot"}, "SIDECAR_BUDGET_USD must be a number"),
    ],
)
def test_sidecar_run_exits_2_with_one_line_and_no_traceback(
    env: dict[str, str], needle: str, tmp_path: Path
) -> None:
    result = run_sidecar(env, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr


def test_port_in_use_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_sidecar(
            {**BASE, "SIDECAR_PORT": str(port), "TTYD_PORT": str(free_port())}, tmp_path
        )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: the port is already in use" in result.stderr
    assert "Traceback" not in result.stderr
    # Nothing was started before the port failed... and nothing was left behind.
    assert not (tmp_path / "state" / "tmux.sock").exists()


def test_malformed_cli_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "clis.yaml"
    bad.write_text("clis:\n  mine:\n    command: [python3, x.py\n    env: {A: 1}\n")
    result = run_sidecar({**BASE, "SIDECAR_CLI_CONFIG": str(bad)}, tmp_path)
    assert result.returncode == 2
    assert str(bad) in result.stderr
    assert "line " in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("- just a list\n", "must be a mapping with a 'clis'"),
        ("clis:\n  mine:\n    command: 'python3 x.py'\n", "must be a non-empty list of strings"),
        ("clis:\n  mine:\n    command: []\n", "must be a non-empty list"),
        ("clis:\n  'bad name!':\n    command: [x]\n", "CLI name"),
        ("clis:\n  mine:\n    command: [x]\n    shell: true\n", "unknown keys"),
        ("clis:\n  mine:\n    command: [x]\n    env: {'1BAD': 'v'}\n", "not a valid variable name"),
        ("clis:\n  mine:\n    command: ['A=B', x]\n", "without '='"),
    ],
)
def test_cli_config_schema_errors(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "clis.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="SIDECAR_CLI_CONFIG") as info:
        load_registry(path)
    assert needle in str(info.value)


def test_cli_config_adds_and_overrides_builtins(tmp_path: Path) -> None:
    path = tmp_path / "clis.yaml"
    path.write_text(
        "clis:\n"
        "  my-cli:\n    command: [python3, /opt/my_cli.py]\n"
        "    resume: [python3, /opt/my_cli.py, --resume]\n"
        "    env: {SOME_VAR: '1', NUM: 2}\n"
        "  shell:\n    command: [/bin/sh]\n"
    )
    registry = load_registry(path)
    assert set(registry) >= {"claude-code", "gemini-cli", "opencode", "codex", "shell", "my-cli"}
    mine = registry["my-cli"]
    assert mine.argv(resume=False, has_history=False) == ("python3", "/opt/my_cli.py")
    assert mine.argv(resume=True, has_history=False) == ("python3", "/opt/my_cli.py", "--resume")
    assert dict(mine.env) == {"SOME_VAR": "1", "NUM": "2"}
    assert registry["shell"].command == ("/bin/sh",)


def test_claude_resumes_only_when_it_has_history(tmp_path: Path) -> None:
    from sidecar.agent.clis.claude_code.hooks import config_dir, has_history

    claude = load_registry(None)["claude-code"]
    workspace = Path("/workspace")
    assert not has_history(config_dir({"HOME": str(tmp_path)}), workspace)
    assert claude.argv(resume=True, has_history=False) == ("claude",)
    history = tmp_path / ".claude" / "projects" / "-workspace"
    history.mkdir(parents=True)
    (history / "abc.jsonl").write_text("{}\n")
    assert has_history(config_dir({"HOME": str(tmp_path)}), workspace)
    assert claude.argv(resume=True, has_history=True) == ("claude", "--continue")
    # First start (resume=False) of a hard resleeve: the history decides, as on a resleeve.
    assert claude.argv(resume=False, has_history=True) == ("claude", "--continue")


def test_a_resume_argv_without_a_history_check_is_for_resleeves_only() -> None:
    codex = load_registry(None)["codex"]
    assert codex.argv(resume=False, has_history=False) == ("codex",)
    assert codex.argv(resume=False, has_history=True) == ("codex",)
    assert codex.argv(resume=True, has_history=False) == ("codex", "resume", "--last")


def test_an_unknown_sleeve_cli_serves_degraded_and_a_resleeve_recovers(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """Like supervisord's FATAL program: the sidecar keeps serving and says why; the envoy can
    resleeve to a CLI that exists without losing the container."""
    sc = make_sidecar(cli="vim-ai").start(wait_healthy=False)
    status = sc.wait_status(lambda s: s["cli_state"] == "fatal", "CLI fatal")
    assert sc.get("/health")[1]["status"] == "degraded"
    assert not status["cli_running"]
    assert status["cli"] == "vim-ai"
    assert any("unknown CLI 'vim-ai'" in w and "shell" in w for w in status["warnings"])
    assert "SLEEVE_CLI: unknown CLI 'vim-ai'" in sc.log()
    # The terminal shows the reason too.
    wait_for(lambda: "unknown CLI 'vim-ai'" in pane_text(sc), what="the reason in the pane")
    assert sc.post("/resleeve", {})[0] == 400  # "again the same" is still unknown
    assert sc.post("/resleeve", {"cli": "shell"})[0] == 202
    sc.wait_status(lambda s: s["cli_running"] and s["cli"] == "shell", "shell running")
    assert sc.get("/health")[1]["status"] == "healthy"
