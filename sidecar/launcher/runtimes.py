"""The runtimes a sleeve can run under, by the name state.json records, and the two decisions
that span them: which one `sleeve run` takes, and what every record says after one look at
reality (`reconcile`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sidecar.launcher.bwrap import BWRAP
from sidecar.launcher.docker import DOCKER
from sidecar.launcher.engine import Container
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.runtime import Reality, Runtime
from sidecar.launcher.state import Run, process_alive

logger = logging.getLogger(__name__)

RUNTIMES: dict[str, Runtime] = {runtime.name: runtime for runtime in (DOCKER, BWRAP)}


def runtime_of(run: Run) -> Runtime:
    """The runtime `run` was recorded under."""
    runtime = RUNTIMES.get(run.runtime)
    if runtime is None:
        msg = f"run {run.id} is recorded under an unknown runtime {run.runtime!r}"
        raise LauncherError(msg)
    return runtime


def in_containers(run: Run) -> bool:
    """Whether `run` is a container (one `docker ps` tells its state)."""
    runtime = RUNTIMES.get(run.runtime)
    return runtime is not None and runtime.uses_containers


def choose(wanted: str | None, *, dry_run: bool) -> Runtime:
    """`--runtime`, else docker when an engine answers (one `docker version`), else bwrap;
    checked to be usable here unless this is a dry run."""
    runtime: Runtime
    if wanted is not None:
        runtime = RUNTIMES[wanted]
    elif (problem := DOCKER.problem()) is None:
        return DOCKER
    else:
        logger.warning("%s; using the bwrap runtime", problem.split(";")[0])
        runtime = BWRAP
    if not dry_run:
        runtime.require()
    return runtime


def reconcile(
    runs: list[Run],
    containers: Sequence[Container] | None,
    alive: Callable[[int, float | None], bool] = process_alive,
    orphans: Sequence[Run] = (),
) -> None:
    """Bring `runs` in line with what is really there (in place).

    `containers` is one labelled `docker ps -a` (None: docker cannot tell, leave docker runs
    as recorded); `orphans` are bwrap runs found running without a record. A run under a
    runtime this launcher does not know is left as recorded.
    """
    by_name = {c.name: c for c in containers} if containers is not None else None
    reality = Reality(by_name, orphans, alive)
    for run in runs:
        runtime = RUNTIMES.get(run.runtime)
        if run.active and runtime is not None:
            runtime.refresh(run, reality)
    for runtime in RUNTIMES.values():
        runs.extend(runtime.unrecorded(runs, reality))
