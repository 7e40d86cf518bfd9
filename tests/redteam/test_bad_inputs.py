"""The issue's bad inputs that end a start with exit 2 naming what is wrong: a sidecar Python
the CLI's user cannot run (the guard runs beside the CLI as that user), and a workspace that
leads into the state dir (it would give the CLI the sidecar's files)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.commands import run_sidecar


def test_a_python_the_clis_user_cannot_run_is_named(short_tmp: Path) -> None:
    """A venv under a directory only root may enter (as one made from /root's interpreter):
    the CLI used to exit 126 with no reason; the start now says what is wrong."""
    if os.geteuid() != 0:
        pytest.skip("runs the CLI as another uid")
    short_tmp.chmod(0o711)  # the user must reach the state dir beneath it
    hidden = short_tmp / "root-only"
    hidden.mkdir(mode=0o700)
    (hidden / "venv").symlink_to(Path(sys.prefix))
    python = hidden / "venv" / "bin" / "python"
    env = {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "SIDECAR_USER": "65534:65534"}
    done = run_sidecar({**env, "SIDECAR_EGRESS_ALLOW": "none"}, short_tmp, python=str(python))
    assert done.returncode == 2, done.stderr
    assert f"cannot run the sidecar's Python {python}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("into", [".", "session"], ids=["the-state-dir", "beneath-it"])
def test_a_workspace_leading_into_the_state_dir_is_refused(tmp_path: Path, into: str) -> None:
    (tmp_path / "state" / "session").mkdir(parents=True, mode=0o700)
    (tmp_path / "ws").symlink_to(tmp_path / "state" / into)
    done = run_sidecar({"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell"}, tmp_path)
    assert done.returncode == 2, done.stderr
    assert "SIDECAR_STATE_DIR" in done.stderr and "overlap" in done.stderr
