"""A third-party OpenAPI fuzzer (schemathesis, every check) against a live sidecar: the server
and its /openapi.json must agree — no undocumented status, no answer off its schema, no invalid
body accepted, no valid one refused, no server error — with and without tokens.

The streaming routes (/events, the terminal's WebSocket and page) are left out: a fuzzer cannot
read an endless stream, and they are tested in test_api.py. Every CLI of the registry is
overridden by `cat` for this test: the fuzzer resleeves at random, and no CLI here may run what
it is sent.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import Sidecar, write_cli_config
from tests.tools import require_executable

TOKEN = "fuzz-admin-token-0123456789"
VIEW_TOKEN = "fuzz-view-token-0123456789"
BUILTINS = ("claude-code", "gemini-cli", "opencode", "codex", "shell")
# Bounded: a fixed number of cases per operation (no --max-time: that budget is spent in full).
MAX_EXAMPLES = "50"


def harmless_registry(path: Path) -> Path:
    return write_cli_config(path, {name: {"command": ["cat"]} for name in BUILTINS})


def fuzz(sc: Sidecar, report: Path, *headers: str) -> subprocess.CompletedProcess[str]:
    schemathesis = Path(sys.executable).with_name("schemathesis")
    if not schemathesis.exists():
        require_executable("schemathesis")
    argv = [
        str(schemathesis),
        "run",
        f"{sc.url}/openapi.json",
        "--checks",
        "all",
        "--exclude-path",
        "/events",
        "--exclude-path-regex",
        "^/terminal",
        "--max-examples",
        MAX_EXAMPLES,
        "--seed",
        "20261123",
        "--workers",
        "1",
        "--no-color",
        "--generation-database",
        "none",
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    for header in headers:
        argv += ["--header", header]
    # cwd: schemathesis keeps a cache of its findings in ./.schemathesis
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False, cwd=report.parent
    )


@pytest.mark.slow
@pytest.mark.timeout(300)  # ~25 operations at 50 cases each: past 120 s on a busy machine
@pytest.mark.parametrize("secured", [False, True], ids=["no-token", "token"])
def test_the_server_and_its_document_agree(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, secured: bool
) -> None:
    env = {"SIDECAR_CLI_CONFIG": str(harmless_registry(short_tmp / "clis.yaml"))}
    headers: list[str] = []
    if secured:
        env |= {"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW_TOKEN}
        headers.append(f"Authorization: Bearer {TOKEN}")
    sc = make_sidecar(cli="shell", env_extra=env).start()
    done = fuzz(sc, short_tmp / "junit.xml", *headers)
    assert done.returncode == 0, f"schemathesis found disagreements:\n{done.stdout[-12000:]}"
    assert "passed" in done.stdout, done.stdout[-3000:]
    # The sidecar is still fine after the run.
    assert sc.get("/health")[0] == 200
