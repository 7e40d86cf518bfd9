"""The tmux session (`contract.TMUX_SESSION`) that hosts the AI CLI; the only module that
imports libtmux.

Every call here is blocking (libtmux runs the tmux client through `subprocess`), so the
supervisor runs them in a worker thread and never on a request path.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libtmux
from libtmux import exc as tmux_exc

from sidecar.core.contract import SCREEN_START, TMUX_SESSION
from sidecar.core.env_file import text as env_file_text
from sidecar.core.files import read_regular, write_new
from sidecar.core.layout import Layout
from sidecar.security.users import User, spawn_credentials

log = logging.getLogger(__name__)

#: The CLI's pane, targeted by its id: `new-session` makes it the first pane of a server we
#: start, which tmux numbers %0, and respawn-pane keeps the id. Unlike a position
#: (`main:0.0`), it stays the CLI's pane when someone at the terminal splits the window and
#: swaps panes. (In a command line tmux parses, quote it: a word starting with % is a directive.)
PANE = "%0"

# The server's options. They are in a config file read when the server starts, so they are in
# force before the first pane exists (history-limit only applies to panes created after it is
# set, and remain-on-exit must be on before a fast-failing CLI exits); and they are set again
# ahead of `new-session` in the same command list: a server that another client's
# `attach-session` started a moment before (ttyd's, while the sidecar heals) read no config of
# ours, and without remain-on-exit the CLI's exit there would close the session.
OPTIONS = (
    ("-g", "history-limit", "50000"),
    ("-g", "remain-on-exit", "on"),
    ("-g", "mouse", "off"),
    ("-g", "status", "off"),
    ("-g", "escape-time", "10"),
    ("-g", "default-terminal", "tmux-256color"),
    ("-g", "aggressive-resize", "off"),
    ("-s", "exit-unattached", "off"),
    ("-s", "set-clipboard", "off"),
)
TMUX_CONF = "".join(f"set {' '.join(option)}\n" for option in OPTIONS)


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
# The CLI's own variables (registry `env:`) come from a file, one NAME=VALUE a line with `\`
# and newlines escaped, exported by `read` and `printf %b`: in no argv (the waiter's stays for
# the CLI's whole life) and never parsed as shell syntax. `umask 027` before the status file:
# with SIDECAR_USER the sidecar reads it through the session dir's group.
WAITER_SCRIPT = (
    "f=$1; e=$2; shift 2; trap : INT QUIT; "
    'if [ -n "$e" ]; then while IFS= read -r l || [ -n "$l" ]; do '
    'v=$(printf "%bx" "${l#*=}"); export "${l%%=*}=${v%x}"; done <"$e"; fi; '
    '"$@"; c=$?; umask 027; printf "%s\\n" "$c" >"$f"; exit "$c"'
)


def pane_command(argv: Sequence[str], status_file: Path, env_file: Path | None) -> list[str]:
    """The argv tmux runs in the pane: the waiter, then the CLI's own argv."""
    env_arg = "" if env_file is None else str(env_file)
    return ["sh", "-c", WAITER_SCRIPT, "sidecar-cli", str(status_file), env_arg, *argv]


class Tmux:
    """`run_as` (SIDECAR_USER): every tmux client, the one that starts the server included,
    runs as that user, with `env` as the server's (and so the CLI's) environment. Root never
    talks to that user's server: a tmux server can make its clients run commands (MSG_SHELL,
    `detach-client -E`), and the user controls that server."""

    def __init__(
        self,
        paths: Layout,
        *,
        run_as: User | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.socket_path = paths.tmux_socket
        self.conf_path = paths.tmux_conf
        self.status_file = paths.cli_status
        self.env_file = paths.cli_env
        self.run_as = run_as
        self.env = dict(env) if env is not None else None
        # The window's size: a new server (a heal, a resleeve) starts at the last one set.
        self.size: tuple[int, int] = SCREEN_START
        self.server = libtmux.Server(
            socket_path=str(self.socket_path), config_file=str(self.conf_path)
        )

    def _cmd(self, *args: str) -> list[str]:
        if self.run_as is not None:
            return self._cmd_as_user(args)
        result = self.server.cmd(*args)
        if result.returncode != 0:
            msg = f"tmux {args[0]} failed: {' '.join(result.stderr).strip() or result.returncode}"
            raise TmuxError(msg)
        return list(result.stdout)

    def client_argv(self, *args: str) -> list[str]:
        """A tmux client's argv on our socket (run it with `client_kwargs`)."""
        binary = shutil.which("tmux", path=(self.env or {}).get("PATH")) or "tmux"
        return [binary, "-S", str(self.socket_path), "-f", str(self.conf_path), *args]

    def client_kwargs(self) -> dict[str, Any]:
        """`subprocess`/asyncio keyword arguments for a tmux client of ours: as the CLI's user
        with its environment (SIDECAR_USER), else as the sidecar."""
        return {"env": self.env, **spawn_credentials(self.run_as)}

    def run_client(
        self, args: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run one tmux client with `args` (blocking); `stdin` reaches it as its input (what
        `load-buffer -` reads: never an argument, so never parsed by tmux)."""
        try:
            return subprocess.run(
                self.client_argv(*args),
                input=stdin,
                capture_output=True,
                timeout=timeout,
                check=False,
                **self.client_kwargs(),
            )
        except FileNotFoundError:
            msg = "tmux is not installed"
            raise TmuxError(msg) from None

    def version(self) -> str | None:
        """What `tmux -V` answers ("tmux 3.5a"); None when tmux cannot be run."""
        try:
            result = self.run_client(["-V"], timeout=10)
        except (TmuxError, OSError, subprocess.TimeoutExpired):
            return None
        answer = result.stdout.decode(errors="replace").strip()
        return answer if result.returncode == 0 and answer else None

    def _cmd_as_user(self, args: Sequence[str]) -> list[str]:
        result = self.run_client(args)
        if result.returncode != 0:
            why = result.stderr.decode(errors="backslashreplace").strip() or result.returncode
            msg = f"tmux {args[0]} failed: {why}"
            raise TmuxError(msg)
        return result.stdout.decode(errors="backslashreplace").splitlines()

    def pane_argv(
        self, argv: Sequence[str], env: Mapping[str, str], *, export: bool = True
    ) -> list[str]:
        """The argv the pane runs for the CLI `argv` with its own variables `env` (pure);
        `export` False: the waiter leaves them to `argv` (the egress guard, which gives them
        to the CLI alone)."""
        return pane_command(argv, self.status_file, self.env_file if env and export else None)

    def _pane_command(
        self, argv: Sequence[str], env: Mapping[str, str], *, export: bool
    ) -> list[str]:
        """Write the CLI's own variables (0640, the sidecar's: with SIDECAR_USER the session
        dir is setgid, so the user's group reads it), then the pane's argv."""
        if not env and export:
            with contextlib.suppress(FileNotFoundError):
                self.env_file.unlink()
        else:  # the guard reads it even when empty
            data = env_file_text(env).encode("utf-8", "surrogateescape")
            write_new(self.env_file, data, 0o640)
        return self.pane_argv(argv, env, export=export)

    def start(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], *, export: bool = True
    ) -> PaneInfo:
        """Start a fresh server with session `main` running `argv` (`export`: see
        `pane_argv`); any old server is killed."""
        self.kill_server()
        self.clear_status()
        width, height = self.size
        # 0644: with SIDECAR_USER the server reads it as that user.
        write_new(self.conf_path, TMUX_CONF.encode(), 0o644)
        # The server's global environment is the sidecar's own (secrets were removed from it
        # at start); each CLI's extra variables come in through `pane_command`.
        self._cmd(
            *(word for option in OPTIONS for word in ("set-option", *option, ";")),
            "new-session",
            "-d",
            "-s",
            TMUX_SESSION,
            "-x",
            str(width),
            "-y",
            str(height),
            "-c",
            str(cwd),
            *self._pane_command(argv, env, export=export),
            # Attached clients never resize the window the CLI draws in: the sidecar does
            # (`PUT /screen/size`). A client larger than the window sees blanks around it, not
            # tmux's dots. (tmux 3.3a crashes when window-size/default-size come from the config
            # file before the first session exists, so they are set right after it, in the same
            # command list.)
            ";",
            "set-option",
            "-g",
            "window-size",
            "manual",
            ";",
            "set-option",
            "-g",
            "default-size",
            f"{width}x{height}",
            ";",
            "set-option",
            "-g",
            "fill-character",
            " ",
        )
        return self.pane_info()

    def respawn(
        self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], *, export: bool = True
    ) -> PaneInfo:
        """Run `argv` in the (dead) pane; `-k` kills whatever still runs there."""
        self.clear_status()
        self._cmd(
            "respawn-pane",
            "-k",
            "-t",
            PANE,
            "-c",
            str(cwd),
            *self._pane_command(argv, env, export=export),
        )
        # Old output stays visible above, like a terminal; the scrollback limit bounds it.
        return self.pane_info()

    def clear_status(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.status_file.unlink()

    def exit_status(self) -> int | None:
        """The CLI's exit code as its waiter recorded it (None: not exited, or killed). The file
        is the CLI user's: a FIFO or a symlink put in its place is not followed or waited on."""
        data = read_regular(self.status_file, 64)
        try:
            return None if data is None else int(data.strip())
        except ValueError:
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
        # A printable separator: for a client it takes for non-UTF-8 (LC_ALL=C), tmux 3.3a
        # prints a tab as "_". No field holds a "|" (numbers and the pane's tty path).
        fmt = "|".join(f"#{{{name}}}" for name in fields)
        out = self._cmd("display-message", "-p", "-t", PANE, fmt)
        if not out:
            msg = "tmux display-message printed nothing"
            raise TmuxError(msg)
        pane_pid, dead, status, dead_signal, server_pid, tty = out[0].split("|")
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
            if self.run_as is not None:
                if self.socket_path.exists():
                    self._cmd("kill-server")
            elif self.server.is_alive():
                self.server.kill()
        except (tmux_exc.LibTmuxException, TmuxError, OSError) as exc:
            log.debug("kill-server: %s", exc)
        # A killed server leaves its socket file behind.
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
