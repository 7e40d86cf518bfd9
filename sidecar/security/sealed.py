"""Keeps this process's memory from processes of its own uid: not dumpable (the kernel then
refuses /proc/PID/mem, /proc/PID/environ, process_vm_readv and ptrace to anyone without
CAP_SYS_PTRACE, which the CLI never has) and no core dump. Inherited by fork, undone by exec.
"""

from __future__ import annotations

import ctypes
import os
import resource

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3

_libc = ctypes.CDLL(None, use_errno=True)


class SealError(OSError):
    """The kernel would not make this process non-dumpable."""


def seal() -> None:
    """Make this process (and the processes it forks without exec) unreadable to its own uid,
    with no core file; SealError when the kernel refuses."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SealError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")
    if _libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise SealError(0, "prctl(PR_SET_DUMPABLE, 0) did not hold")


def sealed() -> bool:
    """Whether this process is non-dumpable now."""
    return bool(_libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
