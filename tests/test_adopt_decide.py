"""`adopt.decide`, the pure half of taking over after a crash: every plan and every reason a
record is not adopted, against real processes standing in for the tmux server, the pane's
waiter and the CLI (their identity comes from /proc, as in a real take-over)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import psutil
import pytest

from sidecar.agent.registry import CLIDef
from sidecar.core.states import ProcState
from sidecar.pane.tmux import PaneInfo, fatal_pane_argv
from sidecar.process.adopt import Plan, argvs_of, decide
from sidecar.process.persist import ProcRef, SupervisorState, cmdline_digest
from tests.harness import wait_for

ARGV = ("bash", "-l")


@dataclass
class Live:
    server: subprocess.Popen[bytes]
    pane: subprocess.Popen[bytes]
    cli_pid: int

    def info(self, *, dead: bool = False) -> PaneInfo:
        return PaneInfo(self.pane.pid, dead, None, self.server.pid, "/dev/pts/0")

    def record(self, **kw: object) -> SupervisorState:
        fields: dict[str, object] = {
            "init": ProcRef.of(os.getpid()),
            "cli": "shell",
            "cli_state": ProcState.RUNNING.value,
            "argv": ARGV,
            "pane_command": cmdline_digest(self.pane.pid),
            "tmux": ProcRef.of(self.server.pid),
            "pane": ProcRef.of(self.pane.pid),
            "cli_pid": ProcRef.of(self.cli_pid),
        }
        fields.update(kw)
        return SupervisorState(**fields)  # type: ignore[arg-type]


@pytest.fixture
def live() -> Iterator[Live]:
    server = subprocess.Popen(["sleep", "300"])
    # `; :` keeps sh from exec-ing sleep: the pane's waiter stays the CLI's parent.
    pane = subprocess.Popen(["sh", "-c", "sleep 300; :"])
    children = wait_for(lambda: psutil.Process(pane.pid).children(), what="the pane's CLI")
    try:
        yield Live(server, pane, children[0].pid)
    finally:
        for proc in (pane, server):
            proc.kill()
            proc.wait()
        psutil.Process(children[0].pid).kill()


INIT = ProcRef.of(os.getpid())


def plan(live: Live, record: SupervisorState | None, info: PaneInfo | None) -> Plan:
    return decide(record, "no state file", INIT, info, {ARGV}).plan


def test_no_record_or_another_run_or_cli_is_a_fresh_start(live: Live) -> None:
    assert decide(None, "no state file", INIT, live.info(), {ARGV}).why == "no state file"
    assert plan(live, None, live.info()) is Plan.FRESH
    other_init = live.record(init=ProcRef(1, 0.0))
    assert decide(other_init, "", INIT, live.info(), {ARGV}).plan is Plan.FRESH
    assert decide(live.record(), "", None, live.info(), {ARGV}).plan is Plan.FRESH
    other_cli = live.record(argv=("codex",))
    assert "another CLI" in decide(other_cli, "", INIT, live.info(), {ARGV}).why


def test_a_matching_record_is_adopted(live: Live) -> None:
    assert plan(live, live.record(), live.info()) is Plan.ADOPT
    # A dead pane is adopted too: its exit is handled by the new supervisor.
    assert plan(live, live.record(), live.info(dead=True)) is Plan.ADOPT


def test_a_gone_server_is_healed(live: Live) -> None:
    assert plan(live, live.record(), None) is Plan.HEAL
    starting = live.record(cli_state=ProcState.STARTING.value)
    assert plan(live, starting, None) is Plan.HEAL


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tmux": ProcRef(1, 0.0)}, "another tmux server"),
        ({"pane": None}, "another pane process"),
        ({"pane_command": "0" * 32}, "another command"),
    ],
)
def test_a_record_that_does_not_match_what_runs_is_a_fresh_start(
    live: Live, change: dict[str, object], why: str
) -> None:
    decision = decide(live.record(**change), "", INIT, live.info(), {ARGV})
    assert decision.plan is Plan.FRESH
    assert why in decision.why


def test_a_cli_pid_that_is_not_the_panes_child_is_not_adopted(live: Live) -> None:
    record = live.record(cli_pid=ProcRef.of(live.server.pid))
    decision = decide(record, "", INIT, live.info(), {ARGV})
    assert (decision.plan, decision.why) == (
        Plan.FRESH,
        "the recorded CLI pid is not the pane's CLI",
    )


def test_a_pane_process_whose_pid_was_reused_is_not_adopted(live: Live) -> None:
    pane = live.record().pane
    assert pane is not None
    record = live.record(pane=ProcRef(pane.pid, pane.start - 1))
    assert plan(live, record, live.info()) is Plan.FRESH


def test_a_crash_while_starting(live: Live) -> None:
    # The launch ran: the pane runs exactly what the record was about to start.
    into_new_server = live.record(cli_state=ProcState.STARTING.value, tmux=None)
    assert plan(live, into_new_server, live.info()) is Plan.ADOPT
    # Not yet: the same server, another pane command -> start it there.
    not_yet = live.record(cli_state=ProcState.STARTING.value, pane_command="0" * 32)
    assert plan(live, not_yet, live.info()) is Plan.RELAUNCH
    # Another server than the recorded one.
    other = live.record(
        cli_state=ProcState.STARTING.value, pane_command="0" * 32, tmux=ProcRef(1, 0.0)
    )
    assert plan(live, other, live.info()) is Plan.FRESH


def test_the_argvs_a_recorded_cli_may_have_run_with() -> None:
    """The recorded argv counts when the launch started from the registry's command or resume
    argv for the recorded CLI, whatever was added to it (hooks, session, egress guard)."""
    cli = CLIDef(name="x", command=("x",), resume=("x", "--resume"))
    ran = ("python", "-I", "-c", "guard", "--", "x", "--settings", "/s.json", "--session-id", "1")
    record = SupervisorState(
        init=ProcRef(1, 0.0), cli="x", cli_state="running", command=("x",), argv=ran
    )
    assert argvs_of(record, {"x": cli}) == {ran}
    resumed = msgspec.structs.replace(record, command=("x", "--resume"))
    assert argvs_of(resumed, {"x": cli}) == {ran}
    # Another registry (the CLI's command changed, or another CLI by that name): no match.
    assert argvs_of(record, {"x": CLIDef(name="x", command=("x", "--other"))}) == set()
    assert argvs_of(record, {}) == set()
    # A state file written before `command` was recorded is not adopted.
    assert argvs_of(msgspec.structs.replace(record, command=()), {"x": cli}) == set()
    fatal = msgspec.structs.replace(record, cli_state=ProcState.FATAL.value, reason="no such CLI")
    assert argvs_of(fatal, {}) == {fatal_pane_argv("no such CLI")}
