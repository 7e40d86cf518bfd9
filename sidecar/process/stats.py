"""Counters the supervisor keeps for `/metrics`: plain numbers updated where things happen (a
CLI exit, a restart, a resleeve), read at scrape time. No metrics library here: the supervisor
and its tests stay free of it, and counting costs an integer add."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SupervisorStats:
    # CLI exits that the supervisor did not cause, by exit code ("unknown" when none was
    # recorded: the pane's waiter was killed too).
    cli_exits: Counter[str] = field(default_factory=Counter)
    cli_restarts: int = 0  # starts by the restart policy (SIDECAR_RESTART)
    resleeves: int = 0  # finished resleeves
    resleeve_seconds: float = 0.0  # their summed duration: POST to the new CLI running
    tmux_heals: int = 0  # tmux servers recreated after dying
    # tmux server deaths by signal (`sidecar.process.deaths.Death.label`: `none` for an exit)
    tmux_deaths: Counter[str] = field(default_factory=Counter)

    def cli_exited(self, code: int | None) -> None:
        self.cli_exits["unknown" if code is None else str(code)] += 1

    def resleeved(self, seconds: float) -> None:
        self.resleeves += 1
        self.resleeve_seconds += seconds
