"""What a sleeve adds to the user's project: `.cstack/` (the task, plan and memory) and
`.needlecast/` (messages). Said once per project, at its first `sleeve run`, and kept out of
`git status` through the repository's own `.git/info/exclude`: a local file git never commits,
so no tracked file changes, and a user who deletes the lines is not overruled later.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sidecar.launcher.instances import git_common_dir

logger = logging.getLogger(__name__)

ADDED = (".cstack/", ".needlecast/")
MARK = "project-files-noted"  # in the project's instance dir: the note was given
HEADER = "# the sleeve's task (.cstack/) and messages (.needlecast/), added by `sleeve run`\n"


def note_once(instance: Path, workspace: Path) -> str | None:
    """The note to print at the project's first run (None: given before), after listing the
    folders in the repository's exclude file when the project is in a git repository."""
    mark = instance / MARK
    if mark.exists():
        return None
    what = f"a sleeve keeps its task in .cstack/ and its messages in .needlecast/ in {workspace}"
    exclude = _exclude(workspace)
    mark.touch(mode=0o600)
    if exclude is None:
        return what
    return (
        f"{what}; both are listed in {exclude}, so `git status` leaves them out (delete the "
        "lines to track them)"
    )


def _exclude(workspace: Path) -> Path | None:
    """Add the folders to `<git common dir>/info/exclude`; its path, or None (no repository,
    or it cannot be written: then git shows them, and nothing else is wrong)."""
    common = git_common_dir(workspace)
    if common is None:
        return None
    exclude = common / "info" / "exclude"
    try:
        text = exclude.read_text(errors="replace") if exclude.exists() else ""
        missing = [name for name in ADDED if name not in text.split()]
        if missing:
            exclude.parent.mkdir(exist_ok=True)
            fd = os.open(exclude, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "a") as fh:
                ended = "" if not text or text.endswith("\n") else "\n"
                fh.write(ended + HEADER + "".join(f"{name}\n" for name in missing))
    except OSError as exc:
        logger.warning("cannot list the sleeve's folders in %s: %s", exclude, exc)
        return None
    return exclude
