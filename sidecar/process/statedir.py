"""SIDECAR_STATE_DIR, prepared once at start (an unusable one is a configuration error, exit 2).

An existing directory is used as it is, unless others can write it (then refused); one the
sidecar makes is 0700. With SIDECAR_USER the layout (its paths: `sidecar.core.layout`) lets the
CLI's user reach what is its own and nothing of the sidecar's:

    $SIDECAR_STATE_DIR/     root, 0710, group = the user's (made so; an existing one must let
                            the user pass): tmux.conf (0644), bin/ (a ttyd copy), the sidecar's
    └── session/            root, 3770 (setgid, sticky), group = the user's: tmux.sock and
                            ttyd.sock (made by the user's tmux and ttyd), cli.status (the
                            waiter's); cli.env and egress.sock (the sidecar's: sticky, so the
                            user can neither rename nor remove them)

Root keeps the user's group as its only supplementary group: that is how it reaches ttyd's
socket, which ttyd (the user) makes 0660, without DAC_OVERRIDE. The workspace and the state dir
never overlap (a workspace that leads into the state dir would give the CLI its files).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sidecar.config import Config, ConfigError
from sidecar.security.reach import can_search
from sidecar.security.users import User, group_name

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the NUL


def _others_can_write(st: os.stat_result, euid: int, egid: int) -> str | None:
    """Why someone besides the sidecar could change the directory, or None."""
    if st.st_uid not in (euid, 0):
        return f"it belongs to uid {st.st_uid}"
    if st.st_mode & stat.S_IWOTH:
        return "every user can write it"
    if st.st_mode & stat.S_IWGRP and st.st_gid != egid:
        return f"group {group_name(st.st_gid)} can write it"
    return None


def _existing(state: Path, config: Config, euid: int, egid: int) -> None:
    st = os.stat(state)
    if not stat.S_ISDIR(st.st_mode):
        msg = f"SIDECAR_STATE_DIR: {state} is not a directory"
        raise ConfigError(msg)
    why = _others_can_write(st, euid, egid)
    if why is not None:
        msg = (
            f"SIDECAR_STATE_DIR: {state} is not private to the sidecar ({why}); "
            "point it at a directory only the sidecar can write, or at a path it may create"
        )
        raise ConfigError(msg)


def _make(state: Path, user: User | None) -> bool:
    """Make the state dir; False when another process made it first (a second sidecar started
    at the same moment: the state dir's lock decides which one runs)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(state, 0o700)
    except FileExistsError:
        return False
    if user is not None:
        # The user passes through to session/ and reads tmux.conf; it lists nothing.
        os.chown(state, -1, user.gid)
        os.chmod(state, 0o710)  # noqa: S103 - search only, for the user's group
    else:
        os.chmod(state, 0o700)  # a umask may take bits even from 0700
    return True


def _session(config: Config, user: User, euid: int) -> None:
    session = config.paths.session_dir
    try:
        os.mkdir(session, 0o700)
    except FileExistsError:
        st = os.lstat(session)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != euid:
            msg = f"SIDECAR_STATE_DIR: {session} exists but is not the sidecar's directory"
            raise ConfigError(msg) from None
    os.chown(session, -1, user.gid)
    # setgid: what the sidecar writes here belongs to the user's group too (0640: readable);
    # sticky: what the sidecar writes here stays its own to rename or remove.
    os.chmod(session, 0o3770)  # noqa: S103 - the user's group: root and the CLI's user


def _apart(state: Path, workspace: Path) -> None:
    """ConfigError when the state dir and the workspace overlap, as the kernel resolves them."""
    real_state, real_ws = Path(os.path.realpath(state)), Path(os.path.realpath(workspace))
    if real_ws.is_relative_to(real_state) or real_state.is_relative_to(real_ws):
        msg = (
            f"SIDECAR_STATE_DIR: {state} and the workspace {workspace} overlap (as "
            f"{real_state} and {real_ws}); the CLI must not reach the sidecar's own files "
            "through its workspace: keep them apart"
        )
        raise ConfigError(msg)


def prepare(config: Config, *, euid: int | None = None, egid: int | None = None) -> None:
    """Make or check the state dir (and the session dir with SIDECAR_USER), or ConfigError."""
    euid = os.geteuid() if euid is None else euid
    egid = os.getegid() if egid is None else egid
    state = config.state_dir
    user = config.user
    _apart(state, config.workspace)
    try:
        if state.exists() or not _make(state, user):
            _existing(state, config, euid, egid)
        probe = state / f".probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
        if user is not None:
            _session(config, user, euid)
    except OSError as exc:
        msg = f"SIDECAR_STATE_DIR: {state} is not a usable directory: {exc.strerror}"
        raise ConfigError(msg) from None
    paths = config.paths
    longest = max(len(os.fsencode(paths.tmux_socket)), len(os.fsencode(paths.ttyd_socket)))
    if longest > SOCKET_PATH_MAX:
        room = SOCKET_PATH_MAX - (longest - len(os.fsencode(state)))
        msg = (
            f"SIDECAR_STATE_DIR: {state} is too long for a socket path inside it "
            f"(max ~{room} bytes)"
        )
        raise ConfigError(msg)
    if user is not None and not can_search(user, paths.session_dir):
        msg = (
            f"SIDECAR_STATE_DIR: SIDECAR_USER {user.spec} cannot reach {paths.session_dir}; "
            f"every directory above it needs x for that user (o+x, or group {user.gid})"
        )
        raise ConfigError(msg)
    if config.user_home is not None and not config.user_home.is_dir():
        msg = f"SIDECAR_USER_HOME: {config.user_home} is not a directory"
        raise ConfigError(msg)
