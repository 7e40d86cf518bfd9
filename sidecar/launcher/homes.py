"""What a slot keeps of each CLI, as the CLI packages declare it (`sidecar.agent.knowledge.Homes`):
the folders and files made in a slot and mounted in the sleeve's HOME, the paths an instance
keeps per project, whether a slot is signed in, and the sign-in a pod seeds.
"""

from __future__ import annotations

import functools
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from sidecar.launcher.fsutil import LauncherError, private_dir, touch_private

if TYPE_CHECKING:
    from sidecar.agent.knowledge import Homes


@functools.cache
def every() -> tuple[Homes, ...]:
    """Every built-in CLI's, in the registry's order (the order of the mounts)."""
    # Here, not at the top: the CLI packages (and yaml) are read by the commands that look at a
    # slot or plan a run, not by every start of `sleeve`.
    from sidecar.agent.registry import BUILTINS

    return tuple(k.homes for k in BUILTINS)


@functools.cache
def seeded() -> Homes:
    """The CLI whose sign-in a pod seeds from a Secret (`sleeve manifest`, the Helm chart)."""
    seeds = [h for h in every() if h.seed is not None]
    if len(seeds) != 1:
        msg = f"one CLI package declares the sign-in a pod seeds (homes.seed), not {len(seeds)}"
        raise LauncherError(msg)
    return seeds[0]


def in_instance(path: str, homes: Homes) -> str:
    """Where an instance keeps `path` (one of `homes`' project paths): under the folder of
    `homes.dirs` that holds it, as it is there (`.claude/projects` -> `projects`)."""
    top = next(d for d in homes.dirs if PurePosixPath(path).is_relative_to(d))
    return str(PurePosixPath(path).relative_to(top))


def mounts(slot: Path, instance: Path) -> list[tuple[Path, str]]:
    """(source, path under HOME) of every CLI's homes, in order: later ones sit on top of
    earlier ones (a project's conversations over the slot's config dir)."""
    found: list[tuple[Path, str]] = []
    for homes in every():
        found += [(slot / d, d) for d in homes.dirs]
        project = (*homes.project_dirs, *homes.project_files)
        found += [(instance / in_instance(p, homes), p) for p in project]
        found += [(slot / f, f) for f in homes.files]
    return found


def make_dirs(slot: Path) -> None:
    """Every CLI's folders in the slot."""
    for homes in every():
        for sub in homes.dirs:
            private_dir(slot / sub)


def make_slot(slot: Path) -> None:
    """Every bind source and target the CLIs' homes need in the slot (a missing source would
    become a dir in Docker): folders, the project paths' places and the files, as they start."""
    make_dirs(slot)
    for homes in every():
        for sub in homes.project_dirs:
            private_dir(slot / sub)
        for sub in homes.project_files:
            touch_private(slot / sub)
        for sub, initial in homes.files.items():
            touch_private(slot / sub, initial)


def make_instance(instance: Path) -> None:
    """The paths an instance keeps per project, as they start (empty)."""
    for homes in every():
        for sub in homes.project_dirs:
            private_dir(instance / in_instance(sub, homes))
        for sub in homes.project_files:
            touch_private(instance / in_instance(sub, homes))


def signed_in(slot: Path) -> bool:
    """Whether the slot holds a CLI's sign-in."""
    return any(h.sign_in is not None and (slot / h.sign_in).exists() for h in every())
