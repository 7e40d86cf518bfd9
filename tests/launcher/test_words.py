"""The launcher's exit codes and words: an unknown CLI (exit 2 before anything starts), a CLI the
runtime does not have (exit 1 with the sleeve's reason, the sleeve stopped), the reason `sleeve
ps` gives for an exited agent, the run's name in the sleeve's /status (what the dashboard's
header shows), `gc` with nothing to do, and the note on `.cstack/` and `.needlecast/` (given
once, the folders kept out of `git status` through `.git/info/exclude`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sidecar.launcher import projectfiles
from tests.harness import http, wait_for
from tests.tools import TMUX_BIN

from .helpers import Result
from .test_instances import git, repo

__all__ = ["repo"]  # the fixture, imported for pytest


def test_an_unknown_cli_exits_2_listing_the_known_ones_before_anything_starts(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("run", "--project", project, "--cli", "claud", "--runtime", "bwrap")
    assert res.code == 2
    assert res.err.strip() == (
        "sleeve: --cli 'claud' is not a known CLI "
        "(known: claude-code, codex, gemini-cli, opencode, shell)"
    )
    assert res.out == ""
    assert not home.exists()  # no slot, no instance, no record


def test_gc_with_nothing_to_remove_says_so(home: Path, sleeve: Callable[..., Result]) -> None:
    for args in (("gc", "--dry-run"), ("gc",)):
        res = sleeve(*args)
        assert res.code == 0
        assert res.err.startswith("nothing to remove"), res.err


def test_the_project_files_are_explained_once_and_kept_out_of_git_status(
    repo: Path, tmp_path: Path
) -> None:
    instance = tmp_path / "instance"
    instance.mkdir()
    exclude = repo / ".git" / "info" / "exclude"
    exclude.write_text("# a user's own line\n*.log")  # no newline at its end
    note = projectfiles.note_once(instance, repo)
    assert note is not None
    assert ".cstack/" in note and ".needlecast/" in note and str(exclude) in note
    assert exclude.read_text().splitlines()[:2] == ["# a user's own line", "*.log"]
    for made in (repo / ".cstack" / "CURRENT.md", repo / ".needlecast" / "inbox.md"):
        made.parent.mkdir()
        made.write_text("x\n")
    status = subprocess.run(
        ["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True
    )
    assert status.stdout == ""
    # Said once: a user who takes the lines out to track the folders is not overruled.
    exclude.write_text("")
    assert projectfiles.note_once(instance, repo) is None
    assert exclude.read_text() == ""


def test_the_note_outside_a_repository_only_explains(tmp_path: Path) -> None:
    instance, plain = tmp_path / "instance", tmp_path / "plain"
    instance.mkdir()
    plain.mkdir()
    note = projectfiles.note_once(instance, plain)
    assert note == (
        f"a sleeve keeps its task in .cstack/ and its messages in .needlecast/ in {plain}"
    )
    git("init", "-q", cwd=plain)  # a repository later: the note was given already
    assert projectfiles.note_once(instance, plain) is None


# The sandbox's PATH is the launcher's: this one has tmux and Python, and none of the AI CLIs.
BARE_PATH = os.pathsep.join([str(TMUX_BIN), str(Path(sys.executable).parent), "/usr/bin:/bin"])


@pytest.mark.needs("bwrap")
def test_a_cli_missing_from_the_runtime_fails_the_run_with_the_sleeves_reason(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    res = sleeve_proc(
        "run", "--project", project, "--runtime", "bwrap", "--cli", "gemini-cli",
        extra_env={"PATH": BARE_PATH},
    )  # fmt: skip
    assert res.code == 1, res.err
    assert "its CLI gemini-cli does not run: 'gemini' not found on PATH" in res.err
    assert "stopped it" in res.err
    (run,) = json.loads(sleeve_proc("ps", "--json").out)
    assert run["status"] == "stopped"


@pytest.mark.needs("bwrap")
def test_ps_gives_the_reason_of_an_exited_agent_and_the_sleeve_is_named_as_ps_names_it(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    res = sleeve_proc("run", "--project", project, "--runtime", "bwrap", "--shell")
    assert res.code == 0, res.err
    (run,) = json.loads(sleeve_proc("ps", "--json").out)
    waiter = psutil.Process(run["pid"])
    try:
        url, auth = f"http://127.0.0.1:{run['port']}", {"Authorization": f"Bearer {run['token']}"}
        status = http("GET", f"{url}/status", headers=auth)[1]
        assert status["sleeve_id"] == run["id"]
        answer = http("POST", f"{url}/input", {"text": "exit 3"}, headers=auth)
        assert answer[0] == 202, answer
        wait_for(
            lambda: http("GET", f"{url}/status", headers=auth)[1]["agent"]["state"] == "exited",
            what="the shell to exit",
        )
        ps = sleeve_proc("ps", extra_env={"COLUMNS": "300"}).out
        row = next(line for line in ps.splitlines() if line.startswith(run["id"]))
        assert row.endswith("exited with code 3"), ps
        assert " exited " in row
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            waiter.send_signal(signal.SIGKILL)  # --die-with-parent takes the sandbox along
