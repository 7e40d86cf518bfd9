"""A fifth CLI from a package outside the sidecar (`tests/toycli`, named by SIDECAR_CLI_PACKAGES,
no module under sidecar/ edited): its hooks report through the relay, its permission dialog is
listed from its screen and answered with its keys, and a resleeve resumes its conversation by
id. The toy's program is a real process in the real pane; nothing is faked."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agenttools import EventLog, wait_agent
from tests.commands import run_until_exit
from tests.harness import Sidecar, wait_for


def toy_sidecar(make_sidecar: Callable[..., Sidecar]) -> Sidecar:
    sc = make_sidecar(cli="toy")
    sc.env_extra.update(SIDECAR_CLI_PACKAGES="tests.toycli", TOY_LOG=str(sc.tmp / "toy.jsonl"))
    return sc.start()


def toy_log(sc: Sidecar) -> list[dict[str, Any]]:
    path = sc.tmp / "toy.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def session(sc: Sidecar) -> str | None:
    return sc.status()["agent"]["session_id"]


def listed(sc: Sidecar) -> list[dict[str, Any]]:
    return list(sc.get("/approvals")[1]["approvals"])


def test_a_toy_cli_from_outside_the_sidecar_gets_state_approvals_and_resume(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = toy_sidecar(make_sidecar)
    events = EventLog(sc)
    assert wait_agent(sc, "idle", 20)["source"] == "hooks"
    [first] = toy_log(sc)
    assert "--resume" not in first["argv"] and "--hooks" in first["argv"]
    # Learnt from its Start hook (the screen may show its prompt, `idle`, a moment before).
    wait_for(lambda: session(sc) == first["session"], 10, what="the toy's session id")

    # Its permission dialog: `waiting` from its hook and its screen, listed from the screen.
    assert sc.post("/input", {"text": "run touch x"})[0] == 202
    request = wait_for(lambda: listed(sc), 20, what="the toy's dialog listed")[0]
    assert (request["tool"], request["source"]) == ("run", "screen")
    assert wait_agent(sc, "waiting")["reason"] == "run: touch x"
    code, body = sc.post(f"/approvals/{request['id']}", {"decision": "allow"})
    assert code == 200 and body["by"] == "api", body
    wait_for(lambda: len(toy_log(sc)) == 2, 20, what="the toy's answer")
    assert toy_log(sc)[1] == {"command": "touch x", "choice": "1", "allowed": True}
    wait_agent(sc, "idle")
    events.wait_states(["idle", "working", "waiting", "idle"])

    # A deny is typed as its own key.
    reply = sc.post("/input", {"text": "run rm y"})
    assert reply[0] == 202, reply
    request = wait_for(lambda: listed(sc), 20, what="the second dialog listed")[0]
    assert sc.post(f"/approvals/{request['id']}", {"decision": "deny"})[0] == 200
    wait_for(lambda: len(toy_log(sc)) == 3, 20, what="the toy's second answer")
    assert toy_log(sc)[2] == {"command": "rm y", "choice": "3", "allowed": False}
    wait_agent(sc, "idle")

    # A resleeve to the same CLI resumes its own conversation, by id.
    assert sc.post("/resleeve", {})[0] == 202
    wait_for(lambda: len(toy_log(sc)) == 4, 20, what="the toy started again")
    again = toy_log(sc)[3]
    assert again["argv"][:2] == ["--resume", first["session"]]
    assert again["session"] == first["session"]
    wait_agent(sc, "idle", 20)
    wait_for(lambda: session(sc) == first["session"], 10, what="the same session id")


def test_a_cli_package_in_the_workspace_is_never_imported(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The agent writes the workspace: a package it planted there is refused before any of its
    code runs (its import would write the marker), and the sidecar does not start (exit 2)."""
    sc = make_sidecar(cli="planted")
    package = sc.workspace / "planted"
    package.mkdir(parents=True)
    marker = short_tmp / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {
        **sc.env(),
        "SIDECAR_CLI_PACKAGES": "planted",
        "PYTHONPATH": f"{sc.workspace}:{sc.env()['PYTHONPATH']}",
    }
    done = run_until_exit([sys.executable, "-m", "sidecar", "run"], env)
    assert done.returncode == 2, done.stderr
    assert "SIDECAR_CLI_PACKAGES: planted:" in done.stderr
    assert "in the workspace" in done.stderr and done.stderr.count("\n") == 1
    assert not marker.exists()
