"""Whether the tmux that runs the pane is one to warn about: tmux 3.3a's server crashes now and
then in its handling of pane output (SIGSEGV), which 3.4 and 3.5 fixed (docs/tmux.md). An older
tmux still runs; `/status` says so in its warnings.
"""

from __future__ import annotations

import re

OLDEST_SOUND = (3, 4)
# "tmux 3.5a", "tmux 3.3", "tmux next-3.6", "tmux openbsd-7.6" (OpenBSD's own numbering: no
# warning), "tmux master" (a build from git: no version to compare).
_VERSION = re.compile(r"^tmux (?:next-)?(\d+)\.(\d+)[a-z]?\b")


def parse(answer: str) -> tuple[int, int] | None:
    """(major, minor) from `tmux -V`'s answer; None when it names no release."""
    found = _VERSION.match(answer.strip())
    return None if found is None else (int(found[1]), int(found[2]))


def warning(answer: str | None) -> str | None:
    """The `/status` warning for the tmux that answered `tmux -V` with `answer`, if it is older
    than 3.4 (None: no warning; a tmux that cannot be asked fails where it is used)."""
    version = parse(answer) if answer else None
    if version is None or version >= OLDEST_SOUND:
        return None
    assert answer is not None
    return (
        f"{answer.strip()} is older than 3.4: its server is known to crash under heavy pane "
        "output, which ends the CLI's turn (the sidecar heals it); install tmux 3.5 or later"
    )
