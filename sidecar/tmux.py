"""The tmux session `main` that hosts the AI CLI; the only module that imports libtmux.

Every call here is blocking (libtmux runs the tmux client through `subprocess`), so the
supervisor runs them in a worker thread and never on a request path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import libtmux
from libtmux import exc as tmux_exc

log = logging.getLogger(__name__)

SESSION = "main"
WIDTH, HEIGHT = 200, 50

# Options are in a config file read when the server starts, so they are in force before the
# first pane exists (history-limit only applies to panes created after it is set, and
# remain-on-exit must be on before a fast-failing CLI exits).
TMUX_CONF = """\
set -g history-limit 50000
set -g remain-on-exit on
set -g mouse off
set -g status off
set -g escape-time 10
set -g default-terminal tmux-256color
set -g aggressive-resize off
set -s exit-unattached off
set -s set-clipboard off
"""


# What the pane runs instead of a CLI that cannot start: the reason, kept on screen. (When a
# pane dies, tmux 3.3a moves its screen into the history, so a browser attaching later would
# see only "Pane is dead".) The reason is a positional parameter, never parsed as shell syntax.
FATAL_PANE_SCRIPT = 'printf "sidecar: %s\\n" "$1"; exec sleep infinity'


def fatal_pane_argv(reason: str) -> tuple[str, ...]:
    return ("sh", "-c", FATAL_PANE_SCRIPT, "sidecar-fatal", reason)


class TmuxError(Exception):
    """tmux could not do what was asked; the message says what."""


@dataclass(frozen=True)
class PaneInfo:
    pane_pid: int
    dead: bool
    dead_status: int | None
    server_pid: int
    tty: str


# The pane runs `sh` with this fixed script; the CLI's argv arrives as positional parameters
# and "$@" hands it to exec unparsed, so no value is ever read as shell syntax. Why a waiter at
# all: tmux 3.3a loses `pane_dead_status` now and then (seen here for 1 in 6 to 7 in 10 quick
# exits), and only the parent can learn a process's exit status. `trap :` keeps the waiter
# alive through a Ctrl-C meant for the CLI (a caught signal is reset to default across exec,
# so the CLI still gets SIGINT normally; an ignored one would be inherited).
WAITER_SCRIPT = 'f=$1; shift; trap : INT QUIT; "$@"; c=$?; printf "%s\\n" "$c" >"$f"; exit "$c"'


def pane_command(argv: Sequence[str], env: Mapping[str, str], status_file: Path) -> list[str]:
    """The argv tmux runs in the pane: the waiter, then `env` setting the CLI's own variables
    for this pane only (a later CLI in the same pane does not inherit them)."""
    # `env -- NAME=VALUE... PROGRAM ARGS`: the registry rejects a program name with "=".
    env_argv = ["env", "--", *(f"{k}={v}" for k, v in env.items()), *argv]
    return ["sh", "-c", WAITER_SCRIPT, "sidecar-cli", str(status_file), *env_argv]


class Tmux:
    def __init__(self, socket_path: Path, conf_path: Path, status_file: Path) -> None:
        self.socket_path = socket_path
        self.conf_path = conf_path
        self.status_file = status_file
        self.server = libtmux.Server(socket_path=str(socket_path), config_file=str(conf_path))

    def _cmd(self, *args: str) -> list[str]:
        result = self.server.cmd(*args)
        if result.returncode != 0:
            msg = f"tmux {args[0]} failed: {' '.join(result.stderr).strip() or result.returncode}"
            raise TmuxError(msg)
        return list(result.stdout)

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> PaneInfo:
        """Start a fresh server with session `main` running `argv`; any old server is killed."""
        self.kill_server()
        self.clear_status()
        self.conf_path.write_text(TMUX_CONF, encoding="utf-8")
        # The server's global environment is the sidecar's own (secrets were removed from it
        # at start); each CLI's extra variables come in through `pane_command`.
        self._cmd(
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            "-c",
            str(cwd),
            *pane_command(argv, env, self.status_file),
            # Attached web clients must never resize the window the CLI draws in. (tmux 3.3a
            # crashes when window-size/default-size come from the config file before the first
            # session exists, so they are set right after it, in the same command list.)
            ";",
            "set-option",
            "-g",
            "window-size",
            "manual",
            ";",
            "set-option",
            "-g",
            "default-size",
            f"{WIDTH}x{HEIGHT}",
        )
        return self.pane_info()

    def respawn(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> PaneInfo:
        """Run `argv` in the (dead) pane; `-k` kills whatever still runs there."""
        self.clear_status()
        self._cmd(
            "respawn-pane",
            "-k",
            "-t",
            f"{SESSION}:0.0",
            "-c",
            str(cwd),
            *pane_command(argv, env, self.status_file),
        )
        # Old output stays visible above, like a terminal; the scrollback limit bounds it.
        return self.pane_info()

    def clear_status(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.status_file.unlink()

    def exit_status(self) -> int | None:
        """The CLI's exit code as its waiter recorded it (None: not exited, or killed)."""
        try:
            return int(self.status_file.read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            return None

    def pane_info(self) -> PaneInfo:
        fields = (
            "pane_pid",
            "pane_dead",
            "pane_dead_status",
            "pane_dead_signal",
            "pid",
            "pane_tty",
        )
        fmt = "\t".join(f"#{{{name}}}" for name in fields)
        out = self._cmd("display-message", "-p", "-t", f"{SESSION}:0.0", fmt)
        if not out:
            msg = "tmux display-message printed nothing"
            raise TmuxError(msg)
        pane_pid, dead, status, dead_signal, server_pid, tty = out[0].split("\t")
        code = int(status) if status.strip() else None
        if code is None and dead_signal.strip():
            code = 128 + int(dead_signal)  # death by signal N, as a shell reports it
        return PaneInfo(
            pane_pid=int(pane_pid),
            dead=dead == "1",
            dead_status=code,
            server_pid=int(server_pid),
            tty=tty,
        )

    def find_pane(self) -> PaneInfo | None:
        """The pane of session `main` on our socket as it runs now (a supervisor started again
        adopts it); None when no server answers there or it has no such session."""
        if not self.socket_path.exists():
            return None  # no tmux call: this is every first start
        try:
            return self.pane_info()
        except TmuxError:
            return None

    def kill_server(self) -> None:
        try:
            if self.server.is_alive():
                self.server.kill()
        except (tmux_exc.LibTmuxException, OSError) as exc:
            log.debug("kill-server: %s", exc)
        # A killed server leaves its socket file behind.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()


def recreate_socket(server_pid: int) -> None:
    """tmux recreates its socket on SIGUSR1 (agents have been seen to `rm -rf` it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(server_pid, signal.SIGUSR1)
