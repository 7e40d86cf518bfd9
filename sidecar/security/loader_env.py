"""The variables that change how a program loads and starts (`LD_PRELOAD` and the rest of glibc's
list of unsafe variables, a shell's start-up file): kept from every process that runs outside
the egress guard (tmux, ttyd, the pane's waiter, the broker), given to the CLI alone.

A process outside the guard that loaded a library of the agent's choosing would run it with an
open network. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping

# glibc's unsecvars.h (what it drops for a setuid program) and two shells' start-up files.
LOADER_VARS = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
        "BASH_ENV",
        "ENV",
    }
)
LOADER_PREFIXES = ("LD_", "MALLOC_")


def is_loader_var(name: str) -> bool:
    return name in LOADER_VARS or name.startswith(LOADER_PREFIXES)


def split(env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """`env` as (what a process outside the guard may get, the loader variables)."""
    outside: dict[str, str] = {}
    loader: dict[str, str] = {}
    for name, value in env.items():
        (loader if is_loader_var(name) else outside)[name] = value
    return outside, loader
