"""The sidecar's configuration, parsed once from the environment into a frozen dataclass.

Nothing else in the package reads ``os.environ``: a bad or missing value raises ``ConfigError``
naming the variable, and ``main`` turns that into one stderr line and exit code 2.
"""

from __future__ import annotations

import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path

from sidecar import tokens
from sidecar.layout import Layout
from sidecar.users import User, UserError, parse_user


class ConfigError(Exception):
    """A configuration value is missing or malformed; the message names the variable."""


class InboxNotify(Enum):
    IDLE = "idle"  # type a notice into an idle CLI marked `prompt: true`
    OFF = "off"


class RestartPolicy(Enum):
    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


@dataclass(frozen=True)
class Config:
    sleeve_name: str
    cli: str
    goal: str | None = None
    repo: str | None = None
    port: int = 8080
    host: str = "0.0.0.0"  # noqa: S104 - the container's API is meant to be published
    # None: ttyd listens on a unix socket only the sidecar (and the CLI's user) can reach.
    ttyd_port: int | None = None
    workspace: Path = Path("/workspace")
    state_dir: Path = Path("/run/sidecar")
    token: str | None = None
    view_token: str | None = None
    # Browser origins allowed besides the page's own (a reverse proxy's public origin); "*": any.
    allowed_origins: frozenset[str] = frozenset()
    # SIDECAR_USER: tmux, ttyd and the CLI run as this user (the sidecar started as root).
    user: User | None = None
    # SIDECAR_USER_HOME: that user's HOME when its passwd entry does not give one.
    user_home: Path | None = None
    cli_config: Path | None = None
    restart: RestartPolicy = RestartPolicy.NO
    stop_grace: float = 5.0
    inbox_notify: InboxNotify = InboxNotify.IDLE
    # `activity` source: pane output within this many seconds is `working`, quiet is `idle`.
    activity_quiet: float = 3.0
    # The environment the CLI inherits (PATH, HOME, API keys, ...), captured once here.
    child_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @cached_property
    def paths(self) -> Layout:
        """Every path in the state dir (with SIDECAR_USER, the CLI's in its session dir)."""
        return Layout(self.state_dir, for_user=self.user is not None)

    @property
    def cli_home(self) -> Path | None:
        """The CLI user's HOME: SIDECAR_USER_HOME, else its passwd entry's, else the workspace
        (None without SIDECAR_USER: the CLI inherits the sidecar's HOME)."""
        if self.user is None:
            return None
        return self.user_home or self.user.home or self.workspace

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, euid: int | None = None) -> Config:
        """`euid`: the uid the sidecar runs as (default: this process's), for SIDECAR_USER."""

        def text(name: str, *, required: bool = False) -> str | None:
            value = env.get(name)
            if value is None or value.strip() == "":
                if required:
                    msg = f"{name} is required and must not be empty"
                    raise ConfigError(msg)
                return None
            if "\x00" in value:
                msg = f"{name} must not contain NUL bytes"
                raise ConfigError(msg)
            return value

        def port(name: str, default: int) -> int:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = int(raw.strip(), 10)
            except ValueError:
                msg = f"{name} must be an integer port number, got {raw!r}"
                raise ConfigError(msg) from None
            if not 1 <= value <= 65535:
                msg = f"{name} must be between 1 and 65535, got {value}"
                raise ConfigError(msg)
            return value

        def seconds(name: str, default: float, low: float, high: float = 3600) -> float:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = float(raw)
            except ValueError:
                msg = f"{name} must be a number of seconds, got {raw!r}"
                raise ConfigError(msg) from None
            if not math.isfinite(value) or not low <= value <= high:
                msg = f"{name} must be between {low:g} and {high:g} seconds, got {raw!r}"
                raise ConfigError(msg)
            return value

        name = text("SLEEVE_NAME", required=True)
        cli = text("SLEEVE_CLI", required=True)
        assert name is not None
        assert cli is not None
        if len(name) > 128 or any(not (c.isprintable() and not c.isspace()) for c in name):
            msg = "SLEEVE_NAME must be at most 128 printable characters without spaces"
            raise ConfigError(msg)

        host = text("SIDECAR_HOST") or "0.0.0.0"  # noqa: S104 - documented default
        if host != "localhost":
            try:
                ipaddress.ip_address(host)
            except ValueError:
                msg = f"SIDECAR_HOST must be an IP address or 'localhost', got {host!r}"
                raise ConfigError(msg) from None

        restart_raw = (text("SIDECAR_RESTART") or "no").strip().lower()
        try:
            restart = RestartPolicy(restart_raw)
        except ValueError:
            msg = f"SIDECAR_RESTART must be one of no, on-failure, always; got {restart_raw!r}"
            raise ConfigError(msg) from None

        grace_raw = text("SIDECAR_STOP_GRACE")
        grace = 5.0
        if grace_raw is not None:
            try:
                grace = float(grace_raw)
            except ValueError:
                msg = f"SIDECAR_STOP_GRACE must be a number of seconds, got {grace_raw!r}"
                raise ConfigError(msg) from None
            if not math.isfinite(grace) or not 0 <= grace <= 3600:
                msg = f"SIDECAR_STOP_GRACE must be between 0 and 3600 seconds, got {grace_raw!r}"
                raise ConfigError(msg)

        notify_raw = (text("SIDECAR_INBOX_NOTIFY") or "idle").strip().lower()
        try:
            inbox_notify = InboxNotify(notify_raw)
        except ValueError:
            msg = f"SIDECAR_INBOX_NOTIFY must be idle or off; got {notify_raw!r}"
            raise ConfigError(msg) from None

        quiet = seconds("SIDECAR_ACTIVITY_QUIET", 3.0, 0.5)

        cli_config = text("SIDECAR_CLI_CONFIG")
        port_value = port("SIDECAR_PORT", 8080)
        ttyd_port = port("TTYD_PORT", 0) or None
        if port_value == ttyd_port:
            msg = f"TTYD_PORT must differ from SIDECAR_PORT (both are {port_value})"
            raise ConfigError(msg)
        try:
            token = tokens.resolve(env, "SIDECAR_TOKEN")
            view_token = tokens.resolve(env, "SIDECAR_VIEW_TOKEN")
        except tokens.TokenError as exc:
            raise ConfigError(str(exc)) from None
        if token is not None and token == view_token:
            msg = "SIDECAR_VIEW_TOKEN must differ from SIDECAR_TOKEN"
            raise ConfigError(msg)

        allowed_origins = frozenset(
            o.strip().rstrip("/").lower()
            for o in (text("SIDECAR_ALLOWED_ORIGINS") or "").split(",")
            if o.strip()
        )
        for origin in allowed_origins - {"*"}:
            scheme, sep, rest = origin.partition("://")
            if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
                msg = (
                    "SIDECAR_ALLOWED_ORIGINS must be comma-separated origins like "
                    f"https://envoy.example:8443 (or *), got {origin!r}"
                )
                raise ConfigError(msg)

        user = _user(text("SIDECAR_USER"), os.geteuid() if euid is None else euid)
        user_home_raw = text("SIDECAR_USER_HOME")
        user_home = Path(user_home_raw) if user_home_raw else None
        if user_home is not None and not user_home.is_absolute():
            msg = f"SIDECAR_USER_HOME must be an absolute path, got {user_home_raw!r}"
            raise ConfigError(msg)
        hidden = {*tokens.TOKEN_VARS, tokens.HANDOVER_VAR}
        return cls(
            sleeve_name=name,
            cli=cli.strip(),
            goal=text("SLEEVE_GOAL"),
            repo=text("SLEEVE_REPO"),
            port=port_value,
            host=host,
            ttyd_port=ttyd_port,
            workspace=Path(text("SIDECAR_WORKSPACE") or "/workspace").absolute(),
            state_dir=Path(text("SIDECAR_STATE_DIR") or "/run/sidecar").absolute(),
            token=token,
            view_token=view_token,
            user=user,
            user_home=user_home if user is not None else None,
            allowed_origins=allowed_origins,
            cli_config=Path(cli_config) if cli_config else None,
            restart=restart,
            stop_grace=grace,
            inbox_notify=inbox_notify,
            activity_quiet=quiet,
            # The CLI never inherits the API's tokens.
            child_env={k: v for k, v in env.items() if k not in hidden},
        )


def _user(raw: str | None, euid: int) -> User | None:
    if raw is None:
        return None
    try:
        user = parse_user(raw)
    except UserError as exc:
        msg = f"SIDECAR_USER: {exc}"
        raise ConfigError(msg) from None
    if euid != 0:
        if user.uid == euid:
            return None  # the sidecar already runs as that user: nothing to switch
        msg = (
            f"SIDECAR_USER={raw} needs the sidecar to start as root, but it runs as uid {euid}; "
            "unset it (everything then runs as this uid) or start the sidecar as root"
        )
        raise ConfigError(msg)
    return user
