"""What a runtime is to the launcher: one object per runtime answers everything that differs.

The launcher never compares runtime names; it looks the object up once (`runtimes`) and asks
it: can it run here, whose user runs the CLI, what to execute, is the sleeve still there, how to
stop it, what its record says after a look at reality. A new runtime is one new subclass,
listed in `runtimes.RUNTIMES`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from sidecar.launcher.engine import Container
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.plan import Command, Limits, RunPlan
from sidecar.launcher.state import Run

POLL_INTERVAL = 0.1  # seconds between looks while waiting on a sleeve


@dataclass(frozen=True)
class Reality:
    """One look at what runs, taken once and shown to every runtime by `reconcile`."""

    # One labelled `docker ps -a`, by name; None: docker cannot tell, its runs stay as recorded.
    containers: Mapping[str, Container] | None
    # Waiters found in the process table: bwrap sleeves, recorded or not.
    waiters: Sequence[Run]
    # Whether a pid is still the process of that start time.
    alive: Callable[[int, float | None], bool]


class Runtime(ABC):
    """A way to run a sleeve; `name` is what state.json records as a run's `runtime`."""

    name: ClassVar[str]
    # Its sleeves are docker containers: one `docker ps` tells their states.
    uses_containers: ClassVar[bool]
    # Seconds between looks at whether a starting sleeve still runs (some looks cost).
    look_interval: ClassVar[float]

    @abstractmethod
    def problem(self) -> str | None:
        """None when this runtime can start a sleeve here, else one line saying why not."""

    def require(self) -> None:
        problem = self.problem()
        if problem is not None:
            raise LauncherError(problem)

    @abstractmethod
    def check_limits(self, limits: Limits) -> None:
        """Raise a LauncherError when this runtime cannot apply `limits` here."""

    @abstractmethod
    def user(self) -> tuple[int, int] | None:
        """The (uid, gid) the plan asks the CLI to run as; None: whoever starts the sleeve."""

    @abstractmethod
    def command(self, run: Run, plan: RunPlan, home: Path, host_env: Mapping[str, str]) -> Command:
        """What starting `run` executes (`run` learns where its log goes, if it has one)."""

    @abstractmethod
    def start(self, run: Run, plan: RunPlan, command: Command) -> None:
        """Execute `command`, filling in what identifies `run` (a container, or pid + start)."""

    @abstractmethod
    def starting(self, run: Run) -> bool:
        """Whether the sleeve of `run` is still on its way up (not ended)."""

    @abstractmethod
    def may_be_running(self, run: Run) -> bool:
        """Whether a stop could still find something of `run`, without asking anyone costly."""

    @abstractmethod
    def stop(self, home: Path, run: Run, grace: float) -> None:
        """Stop `run` and wait for it (the caller has recorded that a stop was asked for)."""

    @abstractmethod
    def refresh(self, run: Run, reality: Reality) -> None:
        """Set the status of an active `run` to what `reality` shows (in place)."""

    @abstractmethod
    def unrecorded(self, runs: Sequence[Run], reality: Reality) -> list[Run]:
        """Sleeves of this runtime that `reality` shows running and no record in `runs` names."""
