"""One sidecar per state dir (sidecar.process.statelock), with real sidecar processes: two
started at the same instant on one state dir (exactly one runs, the other exits 2 naming it); a
lock left by a SIGKILLed sidecar (the next one starts); a supervisor crash (init keeps the lock,
the restarted supervisor serves, a newcomer is still refused)."""

from __future__ import annotations

from collections.abc import Callable

from tests.harness import Sidecar, wait_for
from tests.proctools import kill_supervisor, restarted


def twin(make_sidecar: Callable[..., Sidecar], first: Sidecar) -> Sidecar:
    """A second sidecar of its own (port, workspace, log) on `first`'s state dir."""
    return make_sidecar(env_extra={"SIDECAR_STATE_DIR": str(first.state_dir)})


def refused(sc: Sidecar, holder: Sidecar) -> str:
    """`sc` exited 2 naming `holder`: its one line."""
    assert sc.proc is not None and holder.proc is not None
    assert sc.proc.wait(30) == 2, sc.log()
    line = sc.log().strip().splitlines()[-1]
    assert f"pid {holder.proc.pid}, port {holder.port}" in line, line
    return line


def test_two_sidecars_started_at_once_on_one_state_dir_exactly_one_runs(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    first = make_sidecar()
    second = twin(make_sidecar, first)
    pair = [first, second]
    for sc in pair:
        sc.spawn()  # back to back: both reach the lock within the same few milliseconds

    def one_out() -> Sidecar | None:
        return next((sc for sc in pair if sc.proc is not None and sc.proc.poll() is not None), None)

    loser = wait_for(one_out, 30, what="one of the two sidecars to exit")
    winner = second if loser is first else first
    line = refused(loser, winner)
    assert line.startswith("sidecar: SIDECAR_STATE_DIR: ") and "in use by another sidecar" in line
    # The winner runs as if alone: its CLI, ttyd and tmux untouched by the loser.
    winner.wait_status(lambda s: s["cli_running"] and s["ttyd_state"] == "running", "winner up")
    assert "tmux" not in loser.log()
    assert winner.get("/screen")[0] == 200


def test_a_lock_left_by_a_sigkilled_sidecar_does_not_stop_the_next(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """Everything of the first sidecar is SIGKILLed (no chance to clean up): the kernel let go
    of its lock, and the next sidecar on the state dir starts and serves."""
    first = make_sidecar().start()
    assert (first.state_dir / "sidecar.lock").exists()
    first.kill_everything()
    second = twin(make_sidecar, first).start()
    assert second.status()["cli_running"]
    assert second.proc is not None
    owner = (first.state_dir / "sidecar.lock").read_text().split()
    assert owner == [str(second.proc.pid), str(second.port)]


def test_init_keeps_the_lock_through_a_supervisor_crash(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """The supervisor is SIGKILLed: init starts another (crash-only), which holds the lock with
    it; a sidecar started meanwhile is refused, naming init."""
    first = make_sidecar().start()
    kill_supervisor(first)
    restarted(first, 1)
    second = twin(make_sidecar, first)
    second.spawn()
    refused(second, first)
    assert first.status()["cli_running"]
