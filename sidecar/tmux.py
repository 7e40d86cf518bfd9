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


class TmuxError(Exception):
    """tmux could not do what was asked; the message says what."""


@dataclass(frozen=True)
class PaneInfo:
    pane_pid: int
    dead: bool
    dead_status: int | None
    server_pid: int
    tty: str


def pane_command(argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The argv tmux runs in the pane.

    tmux runs a *single* argument through `sh -c`; `env` in front guarantees several
    arguments, so the CLI's argv is exec'd as is and never parsed by a shell. `env` execs,
    so the pane pid is the CLI's own pid. It also sets the CLI's extra variables for this
    pane only (a later CLI in the same pane does not inherit them).
    """
    return ["env", *(f"{k}={v}" for k, v in env.items()), "--", *argv]


class Tmux:
    def __init__(self, socket_path: Path, conf_path: Path) -> None:
        self.socket_path = socket_path
        self.conf_path = conf_path
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
            *pane_command(argv, env),
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
        self._cmd(
            "respawn-pane", "-k", "-t", f"{SESSION}:0.0", "-c", str(cwd), *pane_command(argv, env)
        )
        # Old output stays visible above, like a terminal; the scrollback limit bounds it.
        return self.pane_info()

    def pane_info(self) -> PaneInfo:
        fmt = "#{pane_pid}\t#{pane_dead}\t#{pane_dead_status}\t#{pid}\t#{pane_tty}"
        out = self._cmd("display-message", "-p", "-t", f"{SESSION}:0.0", fmt)
        if not out:
            msg = "tmux display-message printed nothing"
            raise TmuxError(msg)
        pane_pid, dead, status, server_pid, tty = out[0].split("\t")
        return PaneInfo(
            pane_pid=int(pane_pid),
            dead=dead == "1",
            dead_status=int(status) if status.strip() else None,
            server_pid=int(server_pid),
            tty=tty,
        )

    def kill_server(self) -> None:
        try:
            if self.server.is_alive():
                self.server.kill()
        except (tmux_exc.LibTmuxException, OSError) as exc:
            log.debug("kill-server: %s", exc)


def recreate_socket(server_pid: int) -> None:
    """tmux recreates its socket on SIGUSR1 (agents have been seen to `rm -rf` it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(server_pid, signal.SIGUSR1)
