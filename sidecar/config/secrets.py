"""`SIDECAR_SECRETS_FILE`: the credentials the CLI sees only as placeholders, read once at start
with their real values (from a file, or a variable of the sidecar's own environment). Every
problem is a ConfigError naming the file, the secret and what is wrong (exit 2).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sidecar.config.read import ConfigError, text
from sidecar.core.files import TooBig, read_limited
from sidecar.egress.allowlist import (
    DEFAULT_PORTS,
    Allowlist,
    AllowlistError,
    Pattern,
    parse_pattern,
)
from sidecar.policy.load import NoAliasLoader
from sidecar.security import tokens
from sidecar.security.reach import readable_by
from sidecar.security.users import User

SECRETS_VAR = "SIDECAR_SECRETS_FILE"
MAX_FILE = 64 * 1024  # bytes the secrets file, and each value's file, may hold
MAX_SECRETS = 64
MIN_VALUE = 8  # a shorter value could not be told from ordinary text (redaction)
KEYS = ("name", "env", "file", "from_env", "hosts")
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Variables the sidecar sets for the CLI, or that change how every program runs: a secret's
# placeholder must not take their place.
_RESERVED = re.compile(r"^(SIDECAR_.*|.*_PROXY|PATH|HOME|USER|SHELL|LD_.*|PYTHON.*)$", re.I)


@dataclass(frozen=True)
class Secret:
    """One credential: the CLI's variable `env` holds a placeholder; the proxy puts `value` in
    its place on requests to `hosts`."""

    name: str
    env: str
    hosts: tuple[Pattern, ...]
    source: str  # where the value came from, for messages: `file /run/x`, `from_env VAR`
    from_env: str | None = None
    value: str = field(default="", repr=False)
    file: Path | None = None  # the value's file (None: from_env)


def hidden_variables(env: Mapping[str, str]) -> tuple[str, ...]:
    """The variables the secrets file names, each `from_env` and each `env` (a real value may
    sit in the sidecar's environment under the name the CLI gets a placeholder in): for init
    to hand over across its re-exec, out of its environment block. () without a secrets file."""
    path = text(env, SECRETS_VAR)
    if path is None:
        return ()
    names = (e.get(key) for e in _entries(path) for key in ("from_env", "env"))
    return tuple(dict.fromkeys(n for n in names if isinstance(n, str) and VARIABLE.match(n)))


def read_secrets(
    env: Mapping[str, str], allow: Allowlist | None, user: User | None
) -> tuple[Secret, ...]:
    """The secrets of SIDECAR_SECRETS_FILE with their values; () when it is unset. `allow`:
    the egress allowlist every secret's hosts must be on (None: there is none, an error);
    `user`: SIDECAR_USER (None: the CLI runs as the sidecar's uid)."""
    path = text(env, SECRETS_VAR)
    if path is None:
        return ()
    if allow is None:
        msg = (
            f"{SECRETS_VAR} needs SIDECAR_EGRESS_ALLOW (or _FILE): the egress proxy is the only "
            "way a real value goes out"
        )
        raise ConfigError(msg)
    secrets: list[Secret] = []
    for entry in _entries(path):
        secret = _secret(entry, env, allow, user)
        for other in secrets:
            if other.name == secret.name:
                raise _error(f"two secrets are named {secret.name!r}")
            if other.env == secret.env:
                raise _error(f"secrets {other.name!r} and {secret.name!r} both set {secret.env}")
        secrets.append(secret)
    return tuple(secrets)


def _error(what: str) -> ConfigError:
    return ConfigError(f"{SECRETS_VAR}: {what}")


def _entries(path: str) -> list[dict[str, Any]]:
    """The file's `secrets:` list, each entry a mapping of known keys (not yet checked)."""
    try:
        data = read_limited(path, MAX_FILE)
    except OSError as exc:
        raise _error(f"cannot read {path}: {exc.strerror}") from None
    except TooBig:
        raise _error(f"{path} is larger than {MAX_FILE // 1024} KiB") from None
    loader = NoAliasLoader(data.decode("utf-8", "replace"))
    try:
        doc = loader.get_single_data()
    except (yaml.YAMLError, RecursionError) as exc:
        raise _error(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    finally:
        loader.dispose()
    if not isinstance(doc, dict) or set(doc) != {"secrets"}:
        raise _error(f"{path} must be a mapping with one key, `secrets:` (a list)")
    listed = doc["secrets"]
    if not isinstance(listed, list) or not 1 <= len(listed) <= MAX_SECRETS:
        raise _error(f"`secrets:` must be a list of 1 to {MAX_SECRETS} secrets")
    for number, entry in enumerate(listed, 1):
        if not isinstance(entry, dict):
            raise _error(f"secret {number} must be a mapping (name, env, file or from_env, hosts)")
        unknown = [str(k) for k in entry if k not in KEYS]
        if unknown:
            raise _error(f"secret {number}: unknown key {unknown[0]!r} (one of {', '.join(KEYS)})")
    return listed


def _word(entry: dict[str, Any], key: str, what: str, pattern: re.Pattern[str]) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not pattern.match(value):
        kind = "a name of letters, digits, - and _" if key == "name" else "a variable name"
        raise _error(f"{what}: {key} must be {kind}, got {value!r}")
    return value


def _secret(
    entry: dict[str, Any], env: Mapping[str, str], allow: Allowlist, user: User | None
) -> Secret:
    name = _word(entry, "name", "a secret", NAME)
    what = f"secret {name!r}"
    variable = _word(entry, "env", what, VARIABLE)
    if _RESERVED.match(variable):
        raise _error(f"{what}: env {variable} is the sidecar's or the system's; pick another")
    hosts = _hosts(entry.get("hosts"), what, allow)
    if ("file" in entry) == ("from_env" in entry):
        raise _error(f"{what}: give exactly one of file and from_env")
    if "file" in entry:
        path = entry["file"]
        if not isinstance(path, str) or not path.startswith("/"):
            raise _error(f"{what}: file must be an absolute path, got {path!r}")
        _out_of_reach(path, what, user)
        value = _value(lambda: tokens.read_token_file(f"{what}: file", path, MAX_FILE))
        source, from_env, file = f"file {path}", None, Path(path)
    else:
        from_env = _word(entry, "from_env", what, VARIABLE)
        raw = env.get(from_env)
        if raw is None or raw == "":
            raise _error(f"{what}: from_env {from_env} is not set in the sidecar's environment")
        value = _value(lambda: tokens.check_token(f"{what}: from_env {from_env}", raw, MAX_FILE))
        source, file = f"from_env {from_env}", None
    why = value_problem(value)
    if why is not None:
        raise _error(f"{what}: the value from {source} {why}")
    return Secret(name, variable, hosts, source, from_env, value, file)


def _value(read: Callable[[], str]) -> str:
    try:
        return read()
    except tokens.TokenError as exc:
        raise _error(str(exc)) from None


def _hosts(raw: object, what: str, allow: Allowlist) -> tuple[Pattern, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(h, str) for h in raw):
        raise _error(f"{what}: hosts must be a list of host patterns (api.example.com)")
    patterns: list[Pattern] = []
    for host in raw:
        try:
            pattern = parse_pattern(f"{SECRETS_VAR}: {what}: hosts", host.strip())
        except AllowlistError as exc:
            raise ConfigError(str(exc)) from None
        if pattern.ports != DEFAULT_PORTS:
            raise _error(f"{what}: host {host!r}: no port (the value goes to the host itself)")
        if not any(covers(p, pattern) for p in allow.patterns):
            msg = f"{what}: host {pattern.text} is not on the egress allowlist"
            raise _error(msg)
        patterns.append(pattern)
    return tuple(patterns)


def value_problem(value: str) -> str | None:
    """Why `value` cannot be a secret's real value, or None when it can."""
    if not value.isascii():
        return "is not ASCII (a header carries it)"
    if len(value) < MIN_VALUE:
        return f"is too short; at least {MIN_VALUE} characters"
    return None


def covers(allowed: Pattern, secret: Pattern) -> bool:
    """Whether the allowlist's pattern `allowed` lets the CLI reach `secret`'s hosts (on at
    least one port)."""
    if secret.wildcard:
        return allowed.wildcard and (
            secret.host == allowed.host or secret.host.endswith("." + allowed.host)
        )
    return any(allowed.matches(secret.host, port) for port in allowed.ports)


def _out_of_reach(path: str, what: str, user: User | None) -> None:
    """A value's file the CLI could open is refused: in one-uid mode every file the sidecar
    reads is one the CLI can read; with SIDECAR_USER, one that user can read by its mode."""
    if user is None:
        msg = (
            f"{what}: file {path} is readable by the CLI, which runs as the sidecar's uid "
            f"({os.geteuid()}); use from_env, or SIDECAR_USER with a file only root can read"
        )
        raise _error(msg)
    why = readable_by(user, Path(path))
    if why is not None:
        msg = f"{what}: file {path} is readable by the CLI's user {user.spec}: {why}"
        msg += "; make it 0400 root"
        raise _error(msg)
