"""Process identity that survives pid reuse and wall-clock steps (used by the supervisor and the
launcher alike; standard library only)."""

from __future__ import annotations

import os


def start_time(pid: int) -> float | None:
    """When `pid` started, in seconds after boot (/proc/PID/stat, field 22); None if it is gone.

    A pid and this value name one process: a reused pid starts later. Not psutil's create_time,
    which adds the boot time as the wall clock gives it now, so that a step of the clock (NTP at
    boot, a resumed VM) would make a live process look like another one.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # Field 2 (the command name, in parentheses) may hold spaces and ')': split after the last.
    ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])
    return ticks / os.sysconf("SC_CLK_TCK")
