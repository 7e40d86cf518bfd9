"""The sidecar's configuration, parsed once from the environment into a frozen dataclass.

Nothing else in the package reads ``os.environ``: a bad or missing value raises ``ConfigError``
naming the variable, and ``main`` turns that into one stderr line and exit code 2. The readers
(one per kind of value) are in `sidecar.config.read`, the notification settings in
`sidecar.config.notify`; the values that take more than one reader are here.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path

from sidecar.config.notify import NotifyConfig
from sidecar.config.read import (
    ConfigError,
    choice,
    number,
    port,
    required,
    seconds,
    stop_grace,
    text,
)
from sidecar.config.secrets import SECRETS_VAR, Secret, read_secrets
from sidecar.core.contract import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    DEFAULT_WORKSPACE,
    RECORD_MAX_MB,
    STOP_GRACE,
)
from sidecar.core.layout import Layout
from sidecar.egress.allowlist import Allowlist, AllowlistError, parse_list, read_file, split_value
from sidecar.policy.load import PolicyError, read_policy
from sidecar.policy.rules import Policy
from sidecar.security import tokens
from sidecar.security.users import User, UserError, parse_user

__all__ = [
    "Config",
    "ConfigError",
    "InboxNotify",
    "NotifyConfig",
    "RestartPolicy",
    "Secret",
    "stop_grace",
]

ACTIVITY_QUIET = 3.0


class InboxNotify(Enum):
    IDLE = "idle"  # type a notice into an idle CLI marked `prompt: true`
    OFF = "off"


class Record(Enum):
    ON = "on"
    OFF = "off"


class RestartPolicy(Enum):
    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


def _check_name(name: str) -> None:
    if len(name) > 128 or any(not (c.isprintable() and not c.isspace()) for c in name):
        msg = "SLEEVE_NAME must be at most 128 printable characters without spaces"
        raise ConfigError(msg)


def _host(env: Mapping[str, str]) -> str:
    host = text(env, "SIDECAR_HOST") or DEFAULT_HOST
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            msg = f"SIDECAR_HOST must be an IP address or 'localhost', got {host!r}"
            raise ConfigError(msg) from None
    return host


def _ports(env: Mapping[str, str]) -> tuple[int, int | None]:
    """The API's port, and ttyd's (None: a unix socket)."""
    api = port(env, "SIDECAR_PORT", DEFAULT_PORT)
    ttyd = port(env, "TTYD_PORT", 0) or None
    if api == ttyd:
        msg = f"TTYD_PORT must differ from SIDECAR_PORT (both are {api})"
        raise ConfigError(msg)
    return api, ttyd


def _tokens(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    try:
        token = tokens.resolve(env, tokens.TOKEN_VAR)
        view_token = tokens.resolve(env, tokens.VIEW_TOKEN_VAR)
    except tokens.TokenError as exc:
        raise ConfigError(str(exc)) from None
    if token is not None and token == view_token:
        msg = "SIDECAR_VIEW_TOKEN must differ from SIDECAR_TOKEN"
        raise ConfigError(msg)
    return token, view_token


def _token_files(env: Mapping[str, str]) -> tuple[tuple[str, Path], ...]:
    """The files the tokens were read from, as (variable, absolute path)."""
    named = (tokens.token_file(env, var) for var in tokens.TOKEN_VARS)
    return tuple((var, Path(path).absolute()) for var, path in filter(None, named))


def _origins(env: Mapping[str, str]) -> frozenset[str]:
    allowed = frozenset(
        o.strip().rstrip("/").lower()
        for o in (text(env, "SIDECAR_ALLOWED_ORIGINS") or "").split(",")
        if o.strip()
    )
    for origin in allowed - {"*"}:
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
            msg = (
                "SIDECAR_ALLOWED_ORIGINS must be comma-separated origins like "
                f"https://envoy.example:8443 (or *), got {origin!r}"
            )
            raise ConfigError(msg)
    return allowed


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


def _user_home(env: Mapping[str, str]) -> Path | None:
    raw = text(env, "SIDECAR_USER_HOME")
    home = Path(raw) if raw else None
    if home is not None and not home.is_absolute():
        msg = f"SIDECAR_USER_HOME must be an absolute path, got {raw!r}"
        raise ConfigError(msg)
    return home


EGRESS_VAR = "SIDECAR_EGRESS_ALLOW"
EGRESS_FILE_VAR = "SIDECAR_EGRESS_ALLOW_FILE"


def egress_allowlist(env: Mapping[str, str]) -> Allowlist | None:
    """SIDECAR_EGRESS_ALLOW or _FILE; None (an open network) when neither is set. A variable
    set to nothing is an error, not an open network: the list is a safety feature."""
    if EGRESS_VAR in env and EGRESS_FILE_VAR in env:
        msg = f"{EGRESS_VAR} and {EGRESS_FILE_VAR} are both set; set one of them"
        raise ConfigError(msg)
    try:
        if EGRESS_VAR in env:
            return parse_list(EGRESS_VAR, split_value(env[EGRESS_VAR]))
        if EGRESS_FILE_VAR in env:
            path = text(env, EGRESS_FILE_VAR)
            if path is None:
                msg = f"{EGRESS_FILE_VAR} is empty; name the file holding the allowlist"
                raise ConfigError(msg)
            return parse_list(EGRESS_FILE_VAR, read_file(EGRESS_FILE_VAR, path))
    except AllowlistError as exc:
        raise ConfigError(str(exc)) from None
    return None


@dataclass(frozen=True)
class Recording:
    """SIDECAR_RECORD, _DIR and _MAX_MB (`sidecar.record`)."""

    on: bool = True
    dir: Path | None = None  # None: `Layout.recordings`
    max_bytes: int = RECORD_MAX_MB * 1024 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Recording:
        on = choice(env, "SIDECAR_RECORD", Record.ON) is Record.ON
        raw_dir = text(env, "SIDECAR_RECORD_DIR")
        if raw_dir is not None and not Path(raw_dir).is_absolute():
            msg = f"SIDECAR_RECORD_DIR must be an absolute path, got {raw_dir!r}"
            raise ConfigError(msg)
        mib = number(env, "SIDECAR_RECORD_MAX_MB", "MiB", low=0.1, high=1024 * 1024)
        return cls(
            on=on,
            dir=Path(raw_dir) if raw_dir is not None else None,
            max_bytes=int((mib or RECORD_MAX_MB) * 1024 * 1024),
        )


def _budget(env: Mapping[str, str]) -> tuple[float | None, int | None]:
    """SIDECAR_BUDGET_USD and SIDECAR_BUDGET_TOKENS (the agent's spending limit)."""
    usd = number(env, "SIDECAR_BUDGET_USD", "US dollars", low=0.000001, high=1e9)
    tokens = number(env, "SIDECAR_BUDGET_TOKENS", "tokens", low=1, high=1e15, integer=True)
    return usd, None if tokens is None else int(tokens)


_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _modules(env: Mapping[str, str], name: str) -> tuple[str, ...]:
    """Dotted module paths, separated by commas or whitespace."""
    found = tuple(dict.fromkeys((text(env, name) or "").replace(",", " ").split()))
    bad = [m for m in found if not _MODULE.match(m)]
    if bad:
        msg = f"{name}: {bad[0]!r} is not a dotted module path (like my_clis.toy)"
        raise ConfigError(msg)
    return found


def _path(env: Mapping[str, str], name: str, default: str) -> Path:
    return Path(text(env, name) or default).absolute()


POLICY_VAR = "SIDECAR_POLICY_FILE"


def policy_file(env: Mapping[str, str]) -> tuple[Path | None, Policy | None]:
    """SIDECAR_POLICY_FILE and the policy it holds (None, None: unset). The file is read again
    on SIGHUP with `read_policy`; here a bad one is a configuration error naming its line."""
    raw = text(env, POLICY_VAR)
    if raw is None:
        return None, None
    path = Path(raw).absolute()
    try:
        return path, read_policy(path)
    except PolicyError as exc:
        msg = f"{POLICY_VAR}: {exc}"
        raise ConfigError(msg) from None


def egress_ask(env: Mapping[str, str], allow: Allowlist | None) -> float | None:
    """SIDECAR_EGRESS_ASK: seconds a request for a host off the list is held for an approval."""
    if text(env, "SIDECAR_EGRESS_ASK") is None:
        return None
    if allow is None:
        msg = "SIDECAR_EGRESS_ASK needs SIDECAR_EGRESS_ALLOW (or _FILE): no list, nothing to ask"
        raise ConfigError(msg)
    return seconds(env, "SIDECAR_EGRESS_ASK", 0.0, 0.5, 600.0)


CA_FILE_VAR = "SIDECAR_EGRESS_CA_FILE"


def egress_ca_file(env: Mapping[str, str], secrets: tuple[Secret, ...]) -> Path | None:
    """SIDECAR_EGRESS_CA_FILE: CA certificates the egress proxy trusts for the far ends it
    terminates TLS for (a corporate gateway's), besides the system's. Checked here: a file
    that cannot be read or holds no certificate is an exit 2, not a refusal at the first
    request. With secrets, the `openssl` command that makes the sleeve's CA must be there."""
    if secrets and shutil.which("openssl") is None:
        msg = (
            f"{SECRETS_VAR}: the openssl command (Debian's openssl package) is needed to make "
            "the sleeve's CA for HTTPS hosts with a secret; it is not on PATH"
        )
        raise ConfigError(msg)
    raw = text(env, CA_FILE_VAR)
    if raw is None:
        return None
    path = Path(raw).absolute()
    import ssl  # only with the variable set

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        msg = f"{CA_FILE_VAR}: {path}: not a file of PEM certificates ({exc})"
        raise ConfigError(msg) from None
    return path


@dataclass(frozen=True)
class Config:
    sleeve_name: str
    cli: str
    goal: str | None = None
    repo: str | None = None
    port: int = DEFAULT_PORT
    host: str = DEFAULT_HOST
    # None: ttyd listens on a unix socket only the sidecar (and the CLI's user) can reach.
    ttyd_port: int | None = None
    workspace: Path = Path(DEFAULT_WORKSPACE)
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    token: str | None = None
    view_token: str | None = None
    # SIDECAR_TOKEN_FILE, SIDECAR_VIEW_TOKEN_FILE: (variable, absolute path) of those set.
    token_files: tuple[tuple[str, Path], ...] = ()
    # Browser origins allowed besides the page's own (a reverse proxy's public origin); "*": any.
    allowed_origins: frozenset[str] = frozenset()
    # SIDECAR_USER: tmux, ttyd and the CLI run as this user (the sidecar started as root).
    user: User | None = None
    # SIDECAR_USER_HOME: that user's HOME when its passwd entry does not give one.
    user_home: Path | None = None
    cli_config: Path | None = None
    # SIDECAR_CLI_PACKAGES: CLI packages outside the sidecar (dotted module paths) to register.
    cli_packages: tuple[str, ...] = ()
    restart: RestartPolicy = RestartPolicy.NO
    stop_grace: float = STOP_GRACE
    inbox_notify: InboxNotify = InboxNotify.IDLE
    # SIDECAR_APPROVAL_TIMEOUT: a permission request nobody answered is denied after it.
    approval_timeout: float | None = None
    # `activity` source: pane output within this many seconds is `working`, quiet is `idle`.
    activity_quiet: float = ACTIVITY_QUIET
    # SIDECAR_EGRESS_ALLOW(_FILE): the hosts the CLI may reach; None: the network is open.
    egress: Allowlist | None = None
    # SIDECAR_EGRESS_ALLOW_FILE, read again on SIGHUP.
    egress_file: Path | None = None
    # SIDECAR_EGRESS_ASK: seconds a request for a host off the list waits for an approval.
    egress_ask: float | None = None
    # SIDECAR_EGRESS_CA_FILE: CAs the proxy trusts upstream besides the system's.
    egress_ca_file: Path | None = None
    # SIDECAR_POLICY_FILE (read again on SIGHUP) and the policy it held at start.
    policy_file: Path | None = None
    policy: Policy | None = None
    # SIDECAR_AUDIT_DIR: where the audit trail is appended (None: the state dir).
    audit_dir: Path | None = None
    # SIDECAR_RECORD*: a recording of each CLI run.
    recording: Recording = Recording()
    # SIDECAR_BUDGET_USD, _TOKENS: the agent's spending limit (None: no limit of that kind).
    budget_usd: float | None = None
    budget_tokens: int | None = None
    # SIDECAR_PUBLIC_URL, SIDECAR_NOTIFY_*: notifications (none without a channel).
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # SIDECAR_SECRETS_FILE: the credentials the CLI sees as placeholders, with their values.
    secrets_file: Path | None = None
    secrets: tuple[Secret, ...] = field(default=(), repr=False)
    # The environment the CLI inherits (PATH, HOME, API keys, ...), captured once here.
    child_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @cached_property
    def paths(self) -> Layout:
        """Every path in the state dir (with SIDECAR_USER, the CLI's in its session dir)."""
        return Layout(self.state_dir, for_user=self.user is not None)

    @property
    def audit_path(self) -> Path:
        """The audit trail's directory: SIDECAR_AUDIT_DIR, else the state dir."""
        return self.audit_dir or self.state_dir

    @property
    def record_dir(self) -> Path:
        return self.recording.dir or self.paths.recordings

    @property
    def cli_home(self) -> Path | None:
        """The CLI user's HOME: SIDECAR_USER_HOME, else its passwd entry's, else the workspace
        (None without SIDECAR_USER: the CLI inherits the sidecar's HOME)."""
        if self.user is None:
            return None
        return self.user_home or self.user.home or self.workspace

    @property
    def credential_files(self) -> tuple[tuple[str, Path], ...]:
        """The files outside the state dir that hold credentials, as (variable, absolute
        path): the API tokens', the notification secrets', the secrets file and its values'
        files. The CLI may neither read nor change them (`sidecar.config.trusted`, the egress
        fence), like the state dir's private files."""
        found: list[tuple[str, Path | None]] = [
            *self.token_files,
            *self.notify.files,
            (SECRETS_VAR, self.secrets_file),
            *((f"{SECRETS_VAR}: secret {s.name!r} file", s.file) for s in self.secrets),
        ]
        return tuple((name, path.absolute()) for name, path in found if path is not None)

    @property
    def trusted_paths(self) -> tuple[tuple[str, Path], ...]:
        """What the sidecar reads or writes for people to trust, outside the state dir when
        set, as (variable, absolute path): the credential files, the configuration files
        (some read again on SIGHUP, the CLI registry's commands run outside the guard) and
        the audit and record dirs. The CLI must change none of them (`sidecar.config.trusted`,
        the egress fence)."""
        found: list[tuple[str, Path | None]] = [
            (EGRESS_FILE_VAR, self.egress_file),
            (POLICY_VAR, self.policy_file),
            (CA_FILE_VAR, self.egress_ca_file),
            ("SIDECAR_CLI_CONFIG", self.cli_config),
            ("SIDECAR_AUDIT_DIR", self.audit_dir),
            ("SIDECAR_RECORD_DIR", self.recording.dir),
        ]
        configured = ((name, path.absolute()) for name, path in found if path is not None)
        return (*self.credential_files, *configured)

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, euid: int | None = None) -> Config:
        """`euid`: the uid the sidecar runs as (default: this process's), for SIDECAR_USER."""
        # Read in this order, so that of several bad values the same one is reported first.
        name = required(env, "SLEEVE_NAME")
        cli = required(env, "SLEEVE_CLI")
        _check_name(name)
        host = _host(env)
        restart = choice(env, "SIDECAR_RESTART", RestartPolicy.NO)
        grace = stop_grace(env)
        inbox_notify = choice(env, "SIDECAR_INBOX_NOTIFY", InboxNotify.IDLE)
        quiet = seconds(env, "SIDECAR_ACTIVITY_QUIET", ACTIVITY_QUIET, 0.5)
        approval_timeout = (
            seconds(env, "SIDECAR_APPROVAL_TIMEOUT", 0.0, 1.0)
            if text(env, "SIDECAR_APPROVAL_TIMEOUT") is not None
            else None
        )
        cli_config = text(env, "SIDECAR_CLI_CONFIG")
        cli_packages = _modules(env, "SIDECAR_CLI_PACKAGES")
        api_port, ttyd_port = _ports(env)
        token, view_token = _tokens(env)
        allowed_origins = _origins(env)
        user = _user(text(env, "SIDECAR_USER"), os.geteuid() if euid is None else euid)
        user_home = _user_home(env)
        allowlist = egress_allowlist(env)
        ask = egress_ask(env, allowlist)
        policy_path, policy = policy_file(env)
        audit_dir = text(env, "SIDECAR_AUDIT_DIR")
        allow_file = text(env, EGRESS_FILE_VAR) if allowlist is not None else None
        recording = Recording.from_env(env)
        budget_usd, budget_tokens = _budget(env)
        notify = NotifyConfig.from_env(env)
        secrets = read_secrets(env, allowlist, user)
        ca_file = egress_ca_file(env, secrets)
        # The CLI never gets a secret's real value: its from_env variable is dropped here, and
        # a value under the name the CLI gets the placeholder in (the placeholder is the CLI's
        # own variable, never tmux's or ttyd's).
        hidden = {*tokens.HIDDEN_VARS, tokens.HANDOVER_VAR, SECRETS_VAR}
        hidden |= {s.from_env for s in secrets if s.from_env is not None}
        hidden |= {s.env for s in secrets}
        return cls(
            sleeve_name=name,
            cli=cli.strip(),
            goal=text(env, "SLEEVE_GOAL"),
            repo=text(env, "SLEEVE_REPO"),
            port=api_port,
            host=host,
            ttyd_port=ttyd_port,
            workspace=_path(env, "SIDECAR_WORKSPACE", DEFAULT_WORKSPACE),
            state_dir=_path(env, "SIDECAR_STATE_DIR", DEFAULT_STATE_DIR),
            token=token,
            view_token=view_token,
            token_files=_token_files(env),
            user=user,
            user_home=user_home if user is not None else None,
            allowed_origins=allowed_origins,
            cli_config=Path(cli_config) if cli_config else None,
            cli_packages=cli_packages,
            restart=restart,
            stop_grace=grace,
            inbox_notify=inbox_notify,
            activity_quiet=quiet,
            approval_timeout=approval_timeout,
            egress=allowlist,
            egress_file=Path(allow_file).absolute() if allow_file else None,
            egress_ask=ask,
            egress_ca_file=ca_file,
            policy_file=policy_path,
            policy=policy,
            audit_dir=Path(audit_dir).absolute() if audit_dir else None,
            recording=recording,
            budget_usd=budget_usd,
            budget_tokens=budget_tokens,
            notify=notify,
            secrets_file=_path(env, SECRETS_VAR, "") if secrets else None,
            secrets=secrets,
            # The CLI never inherits the API's tokens, nor where notifications go: a topic or
            # a webhook's URL is often its only key, and the agent must not forge a
            # notification with links of its own.
            child_env={
                k: v
                for k, v in env.items()
                if k not in hidden and not k.startswith("SIDECAR_NOTIFY_")
            },
        )
