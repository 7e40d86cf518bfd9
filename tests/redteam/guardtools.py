"""Running an attacker in the red-team tests: as another uid, under the egress guard."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from sidecar.egress.guard import guard_argv
from tests.tools import SYSTEM_PYTHON

NOBODY = 65534


def run_as(uid: int, argv: Sequence[str], **kw: object) -> subprocess.CompletedProcess[str]:
    """`argv` as `uid` (with the system's Python when not root: the venv's is root's)."""
    if uid:
        argv = [SYSTEM_PYTHON if a == sys.executable else a for a in argv]
        kw |= {"user": uid, "group": uid, "extra_groups": [], "cwd": "/"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kw)  # type: ignore[call-overload,no-any-return]


def guarded(argv: Sequence[str], **kw: object) -> tuple[str, ...]:
    return guard_argv(argv, [("127.0.0.1", 1)], kw.pop("report", None), **kw)  # type: ignore[arg-type]
