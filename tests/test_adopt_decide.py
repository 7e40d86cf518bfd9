"""`adopt.decide`, the pure half of taking over after a crash: every plan and every reason a
record is not adopted, over snapshots of what runs (`Observed`) built here, as the supervisor's
look at tmux and /proc would report them; no process runs."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest

from sidecar.agent.registry import CLIDef
from sidecar.core.states import ProcState
from sidecar.pane.tmux import PaneInfo, fatal_pane_argv
from sidecar.process.adopt import Observed, Plan, argvs_of, decide
from sidecar.process.persist import ProcRef, SupervisorState

ARGV = ("bash", "-l")
INIT = ProcRef(1, 0.5)
SERVER = ProcRef(100, 10.0)  # the tmux server
PANE = ProcRef(101, 11.0)  # the pane's waiter
CLI = ProcRef(102, 12.0)  # the CLI, the waiter's child
COMMAND = "c" * 32  # the digest of the pane's argv
LIVE = PaneInfo(PANE.pid, False, None, SERVER.pid, "/dev/pts/0")
# What runs: the pane the record names, in the server it names, running what it names.
SEEN = Observed(LIVE, SERVER, PANE, COMMAND, cli_parent=PANE.pid)
DEAD = replace(SEEN, live=replace(LIVE, dead=True))
NOTHING = Observed()  # no tmux server on our socket


def record(**kw: object) -> SupervisorState:
    fields: dict[str, object] = {
        "init": INIT,
        "cli": "shell",
        "cli_state": ProcState.RUNNING.value,
        "argv": ARGV,
        "pane_command": COMMAND,
        "tmux": SERVER,
        "pane": PANE,
        "cli_pid": CLI,
    }
    fields.update(kw)
    return SupervisorState(**fields)  # type: ignore[arg-type]


def plan(rec: SupervisorState | None, seen: Observed) -> Plan:
    return decide(rec, "no state file", INIT, seen, {ARGV}).plan


def test_no_record_or_another_run_or_cli_is_a_fresh_start() -> None:
    assert decide(None, "no state file", INIT, SEEN, {ARGV}).why == "no state file"
    assert plan(None, SEEN) is Plan.FRESH
    other_init = record(init=ProcRef(1, 0.0))
    assert decide(other_init, "", INIT, SEEN, {ARGV}).plan is Plan.FRESH
    assert decide(record(), "", None, SEEN, {ARGV}).plan is Plan.FRESH
    other_cli = record(argv=("codex",))
    assert "another CLI" in decide(other_cli, "", INIT, SEEN, {ARGV}).why


def test_a_matching_record_is_adopted() -> None:
    assert plan(record(), SEEN) is Plan.ADOPT
    # A dead pane is adopted too: its exit is handled by the new supervisor.
    assert plan(record(), DEAD) is Plan.ADOPT


def test_a_gone_server_is_healed() -> None:
    assert plan(record(), NOTHING) is Plan.HEAL
    starting = record(cli_state=ProcState.STARTING.value)
    assert plan(starting, NOTHING) is Plan.HEAL


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tmux": ProcRef(1, 0.0)}, "another tmux server"),
        ({"pane": None}, "another pane process"),
        ({"pane_command": "0" * 32}, "another command"),
    ],
)
def test_a_record_that_does_not_match_what_runs_is_a_fresh_start(
    change: dict[str, object], why: str
) -> None:
    decision = decide(record(**change), "", INIT, SEEN, {ARGV})
    assert decision.plan is Plan.FRESH
    assert why in decision.why


def test_a_cli_pid_that_is_not_the_panes_child_is_not_adopted() -> None:
    # The recorded CLI runs, but /proc gives it another parent than the pane's process.
    seen = replace(SEEN, cli_parent=SERVER.pid)
    decision = decide(record(), "", INIT, seen, {ARGV})
    assert (decision.plan, decision.why) == (
        Plan.FRESH,
        "the recorded CLI pid is not the pane's CLI",
    )
    # A recorded CLI that is gone (its pid free, or another process's) says nothing against it.
    assert plan(record(), replace(SEEN, cli_parent=None)) is Plan.ADOPT


def test_a_pane_process_whose_pid_was_reused_is_not_adopted() -> None:
    rec = record(pane=ProcRef(PANE.pid, PANE.start - 1))
    assert plan(rec, SEEN) is Plan.FRESH


def test_a_crash_while_starting() -> None:
    # The launch ran: the pane runs exactly what the record was about to start.
    into_new_server = record(cli_state=ProcState.STARTING.value, tmux=None)
    assert plan(into_new_server, SEEN) is Plan.ADOPT
    # Not yet: the same server, another pane command -> start it there.
    not_yet = record(cli_state=ProcState.STARTING.value, pane_command="0" * 32)
    assert plan(not_yet, SEEN) is Plan.RELAUNCH
    # Another server than the recorded one.
    other = record(cli_state=ProcState.STARTING.value, pane_command="0" * 32, tmux=ProcRef(1, 0.0))
    assert plan(other, SEEN) is Plan.FRESH


def test_the_argvs_a_recorded_cli_may_have_run_with() -> None:
    """The recorded argv counts when the launch started from the registry's command or resume
    argv for the recorded CLI, whatever was added to it (hooks, session, egress guard)."""
    cli = CLIDef(name="x", command=("x",), resume=("x", "--resume"))
    ran = ("python", "-I", "-c", "guard", "--", "x", "--settings", "/s.json", "--session-id", "1")
    rec = SupervisorState(
        init=ProcRef(1, 0.0), cli="x", cli_state="running", command=("x",), argv=ran
    )
    assert argvs_of(rec, {"x": cli}) == {ran}
    resumed = msgspec.structs.replace(rec, command=("x", "--resume"))
    assert argvs_of(resumed, {"x": cli}) == {ran}
    # Another registry (the CLI's command changed, or another CLI by that name): no match.
    assert argvs_of(rec, {"x": CLIDef(name="x", command=("x", "--other"))}) == set()
    assert argvs_of(rec, {}) == set()
    # A state file written before `command` was recorded is not adopted.
    assert argvs_of(msgspec.structs.replace(rec, command=()), {"x": cli}) == set()
    fatal = msgspec.structs.replace(rec, cli_state=ProcState.FATAL.value, reason="no such CLI")
    assert argvs_of(fatal, {}) == {fatal_pane_argv("no such CLI")}
