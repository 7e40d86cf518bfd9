"""Inbox notices with SIDECAR_USER, as the Docker runtime always runs: the sidecar (root, with only
SETUID, SETGID and KILL left) reads the inbox in a workspace private to the CLI's user by acting
as that user, and the notice reaches the CLI. Real processes, a bare uid with no passwd entry.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.agenttools import EventLog, wait_agent, wait_ticks
from tests.harness import CLIS, Sidecar, wait_for, write_cli_config
from tests.tools import SYSTEM_PYTHON, missing

UID = GID = 23457  # no passwd entry on purpose


@pytest.fixture
def user_sidecar(make_sidecar: Callable[..., Sidecar], short_tmp: Path) -> Sidecar:
    """A sidecar with SIDECAR_USER=UID:GID, its workspace that uid's and closed to all others
    (0700: root without DAC_OVERRIDE cannot look in), and a `prompt: true` CLI that logs every
    line it reads to a file in the workspace."""
    if os.geteuid() != 0:
        missing("running the CLI as another user needs the tests to run as root")
    short_tmp.chmod(0o711)  # every directory above the workspace: passable by the user
    typed = Path("typed.txt")
    cli = {"command": [SYSTEM_PYTHON, str(CLIS / "prompt_cli.py"), str(typed)], "prompt": True}
    sc = make_sidecar(cli="pcli")
    config = write_cli_config(sc.tmp / "clis.yaml", {"pcli": cli})
    sc.env_extra.update(
        SIDECAR_USER=f"{UID}:{GID}",
        SIDECAR_CLI_CONFIG=str(config),
        SIDECAR_ACTIVITY_QUIET="1",
    )
    sc.tmp.chmod(0o711)
    sc.workspace.mkdir()
    os.chown(sc.workspace, UID, GID)
    sc.workspace.chmod(0o700)
    return sc


def test_an_inbox_notice_reaches_a_cli_running_as_another_user(user_sidecar: Sidecar) -> None:
    sc = user_sidecar.start()
    typed = sc.workspace / "typed.txt"  # relative in the argv: the CLI runs in the workspace
    events = EventLog(sc)
    wait_agent(sc, "idle")
    code, posted = sc.post(
        "/inbox", {"from": "envoy", "type": "task", "content": "Rotate the keys\nDetails..."}
    )
    assert code == 201, posted
    inbox = sc.workspace / ".needlecast" / "inbox.md"
    assert (inbox.stat().st_uid, inbox.stat().st_gid) == (UID, GID)
    notified = events.wait(lambda e: e["type"] == "inbox-notified", "inbox-notified", 20)
    assert notified["ids"] == [posted["id"]]
    assert "Rotate the keys" in notified["text"]
    # Typed into the CLI, which read it as its own line.
    wait_for(lambda: notified["text"] in typed.read_text(), 10, what="the notice typed")
    assert typed.stat().st_uid == UID
    # Nothing failed on the way.
    assert "PermissionError" not in sc.log() and "cannot look at the inbox" not in sc.log()


def test_an_inbox_the_user_cannot_read_is_logged_once_and_notices_resume_when_it_can(
    user_sidecar: Sidecar,
) -> None:
    """`.needlecast/` root's and 0700, a message in it: the once-a-second look fails each time
    and says so in the log once, not once a second; given to the user, the notice comes."""
    sc = user_sidecar
    needlecast = sc.workspace / ".needlecast"
    needlecast.mkdir(mode=0o700)  # root's: closed to the user, and so to the sidecar
    (needlecast / "inbox.md").write_text(
        "---\nid: msg-closed\nfrom: envoy\nto: sleeve\ntype: task\n"
        "time: 2026-01-21T10:10:00Z\n---\nHello from a closed inbox\n"
    )
    current = sc.workspace / ".cstack" / "CURRENT.md"
    current.parent.mkdir()
    os.chown(current.parent, UID, GID)
    sc.start()
    events = EventLog(sc)
    wait_agent(sc, "idle")
    # Every tick is a look: three ticks are three looks that failed.
    wait_ticks(sc, events, 3)
    assert sc.log().count("cannot look at the inbox") == 1, sc.log()
    assert "PermissionError" in sc.log()
    assert events.of("inbox-notified") == []
    for path in (needlecast, needlecast / "inbox.md"):
        os.chown(path, UID, GID)
    notified = events.wait(lambda e: e["type"] == "inbox-notified", "inbox-notified", 20)
    assert notified["ids"] == ["msg-closed"]
    wait_for(lambda: "inbox notices work again" in sc.log(), 10, what="the recovery logged")
