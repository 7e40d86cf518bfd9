"""`sleeve ps` lists a waiting sleeve's permission requests, and `sleeve approve|deny NAME ID`
answer one through that sleeve's API with its recorded token: a real sidecar (its agent a
stand-in CLI with Claude Code's hook state, the requests made as Claude Code makes them),
recorded the way `sleeve run` records a sleeve.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from sidecar.launcher import instances
from sidecar.launcher.slots import Project
from sidecar.launcher.state import StateStore
from tests.harness import Sidecar, wait_for
from tests.standin import HeldHook, waiting_sidecar

from .helpers import Result
from .test_ps_agent import record

TOKEN = "approve-token-0123456789"
VIEW_TOKEN = "approve-view-token-0123456789"
COMMAND = "rm -rf build \x1b[31m\u202e"


def listed(sc: Sidecar) -> list[dict[str, str]]:
    return list(sc.get("/approvals")[1]["approvals"])


def test_ps_lists_the_requests_and_approve_answers_one_exactly_once(
    make_sidecar: Callable[..., Sidecar],
    short_tmp: Path,
    home: Path,
    sleeve: Callable[..., Result],
) -> None:
    sc = waiting_sidecar(make_sidecar, short_tmp, COMMAND, SIDECAR_TOKEN=TOKEN)
    [request] = listed(sc)
    run = record(home, sc, 1, sc.port, TOKEN)

    res = sleeve("ps", "--json")
    assert res.code == 0, res.err
    [shown] = json.loads(res.out)
    assert shown["agent"] == "waiting"
    [pending] = shown["approvals"]
    assert (pending["id"], pending["tool"]) == (request["id"], "Bash")
    assert pending["summary"] == "rm -rf build [31m"  # as the sidecar cleaned it, printable
    assert pending["since"] == request["since"]

    table = sleeve("ps", extra_env={"COLUMNS": "60"}).out.splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith(run.id))
    assert table[at + 1] == f"  approval {request['id']}  Bash: rm -rf build [31m"
    assert table[-1].startswith("answer: `sleeve approve NAME ID")

    res = sleeve("approve", run.id, request["id"])
    assert (res.code, res.out) == (0, f"allowed {request['id']} in sleeve {run.id}\n"), res.err
    assert listed(sc) == []
    [shown] = json.loads(sleeve("ps", "--json").out)
    assert shown["approvals"] == []
    assert "approval " not in sleeve("ps").out

    again = sleeve("deny", run.id, request["id"])
    assert again.code == 1 and again.err.count("\n") == 1, again.err
    assert "409" in again.err and "allow by api" in again.err, again.err
    unknown = sleeve("approve", run.id, "no-such-id")
    assert unknown.code == 1 and "404" in unknown.err, unknown.err
    nobody = sleeve("approve", "no-such-run", request["id"])
    assert nobody.code == 1 and "no running sleeve 'no-such-run'" in nobody.err, nobody.err


def test_deny_by_slot_with_a_message_and_refusals_say_why(
    make_sidecar: Callable[..., Sidecar],
    short_tmp: Path,
    home: Path,
    project: Path,
    sleeve: Callable[..., Result],
) -> None:
    sc = waiting_sidecar(
        make_sidecar, short_tmp, "make", SIDECAR_TOKEN=TOKEN, SIDECAR_VIEW_TOKEN=VIEW_TOKEN
    )
    hook = HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": "curl x | sh"}})
    request = wait_for(
        lambda: next((a for a in listed(sc) if a["summary"] == "curl x | sh"), None),
        10,
        what="the second request listed",
    )
    run = record(home, sc, 1, sc.port, TOKEN)
    run.project = Project(
        instances.canonical_root(project), home
    ).key  # slot 1 of `project`, for `sleeve deny 1 --project`
    StateStore(home).upsert(run)
    viewer = record(home, sc, 2, sc.port, VIEW_TOKEN)
    tokenless = record(home, sc, 3, sc.port, None)

    refused = sleeve("approve", viewer.id, request["id"])
    assert refused.code == 1 and "403" in refused.err and "read-only" in refused.err, refused.err
    anonymous = sleeve("approve", tokenless.id, request["id"])
    assert anonymous.code == 1 and "(no token recorded for it)" in anonymous.err, anonymous.err
    escape = sleeve("deny", "1", request["id"], "--project", project, "--message", "a\x1b[2Jb")
    assert escape.code == 1 and "400" in escape.err and "U+001B" in escape.err, escape.err
    assert request["id"] in [a["id"] for a in listed(sc)]  # none of them answered it

    res = sleeve("deny", "1", request["id"], "--project", project, "--message", "not piped")
    assert res.code == 0, res.err
    assert res.out == f"denied {request['id']} in sleeve {run.id}\n"
    hook.thread.join(10)
    assert hook.reply is not None
    decision = hook.reply.body["hookSpecificOutput"]["decision"]
    assert decision == {"behavior": "deny", "message": "not piped"}
    missing = sleeve("deny", "7", request["id"], "--project", project)
    assert missing.code == 1 and "no running sleeve '7'" in missing.err, missing.err
