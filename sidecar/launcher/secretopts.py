"""`sleeve run/manifest --secret NAME=FILE[,env=VAR][,hosts=HOST;HOST]`: the credentials a
sleeve's agent sees only as placeholders. Checked on the host before anything starts (each file
read once, its value kept in memory), then written as the sidecar's SIDECAR_SECRETS_FILE
(contract "Secrets"), which says where a value is, never the value itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.plan import FROM_ENV_PREFIX

if TYPE_CHECKING:
    from sidecar.egress.allowlist import Pattern

# The allowlist's parser and the token reader are imported where they are used: the commands
# that take `--secret` import this module, `sleeve slots` does not (within 100 ms: scripts/bench).

#: Well-known names: the variable the CLI reads and the hosts the value is for.
KNOWN: dict[str, tuple[str, tuple[str, ...]]] = {
    "anthropic": ("ANTHROPIC_API_KEY", ("api.anthropic.com",)),
    # Claude Code's long-lived sign-in (`claude setup-token`): no refresh token, so the CLI never
    # refreshes it, and it travels as `Authorization: Bearer` (docs/launcher.md, "OAuth").
    "claude": ("CLAUDE_CODE_OAUTH_TOKEN", ("api.anthropic.com",)),
    "openai": ("OPENAI_API_KEY", ("api.openai.com",)),
    "gemini": ("GEMINI_API_KEY", ("generativelanguage.googleapis.com",)),
    "github": ("GH_TOKEN", ("github.com", "api.github.com")),
}
#: The name whose secret git also sends (as the password of HTTPS Basic auth to github.com).
GIT_SECRET = "github"  # noqa: S105 - a name, not a password
GIT_URL = "https://github.com"
OPTIONS = ("env", "hosts")
SYNTAX = "NAME=FILE[,env=VAR][,hosts=HOST;HOST...]"


class SecretError(LauncherError):
    """A `--secret` that cannot be used; the message names it and what is wrong."""


@dataclass(frozen=True)
class SecretArg:
    """One `--secret`: the CLI's variable `env` holds a placeholder; the sidecar sends `value`
    (read from `path`) to `hosts` only."""

    name: str
    env: str
    hosts: tuple[str, ...]
    path: str
    value: str = field(default="", repr=False)

    @property
    def from_env(self) -> str:
        return FROM_ENV_PREFIX + self.name.upper().replace("-", "_")


def parse(spec: str) -> SecretArg:
    """One `--secret` as written (the file is read: see `read_value`), by the sidecar's rules
    (sidecar.config.secrets), checked here first."""
    from sidecar.config.secrets import NAME, VARIABLE

    name, sep, rest = spec.partition("=")
    if not sep or not rest:
        raise SecretError(f"--secret {spec!r}: write {SYNTAX}")
    if not NAME.match(name):
        msg = f"--secret {name!r}: a name is a letter, then letters, digits, - and _"
        raise SecretError(msg)
    parts = rest.split(",")
    # A comma belongs to the file name until the first `env=` or `hosts=`.
    first = next((i for i, p in enumerate(parts) if p.partition("=")[0] in OPTIONS), len(parts))
    path = os.path.expanduser(",".join(parts[:first]))  # the shell leaves `NAME=~/key` alone
    options: dict[str, str] = {}
    for part in parts[first:]:
        key, sep, value = part.partition("=")
        if key not in OPTIONS or not sep or not value or key in options:
            msg = f"--secret {name}: {part!r} is not env=VAR or hosts=HOST;HOST, given once"
            raise SecretError(msg)
        options[key] = value
    env, hosts = KNOWN.get(name, (None, ()))
    env = options.get("env", env)
    if "hosts" in options:
        hosts = tuple(h.strip() for h in options["hosts"].split(";") if h.strip())
    if env is None or not hosts:
        known = ", ".join(KNOWN)
        msg = f"--secret {name}: not a known name ({known}); give env=VAR and hosts=HOST;HOST"
        raise SecretError(msg)
    if not VARIABLE.match(env):
        raise SecretError(f"--secret {name}: env={env!r} is not a variable name")
    return SecretArg(name, env, tuple(_host(name, h).text for h in hosts), path)


def _host(name: str, text: str) -> Pattern:
    from sidecar.egress.allowlist import DEFAULT_PORTS, AllowlistError, parse_pattern

    try:
        pattern = parse_pattern(f"--secret {name}: hosts", text)
    except AllowlistError as exc:
        raise SecretError(str(exc)) from None
    if pattern.ports != DEFAULT_PORTS:
        raise SecretError(f"--secret {name}: host {text!r}: no port (the value goes to the host)")
    return pattern


def read_value(secret: SecretArg) -> SecretArg:
    """`secret` with its file's value (one trailing newline stripped); a SecretError when the
    file is missing, unreadable, empty, too large or holds a line break (a header carries it)."""
    from sidecar.config.secrets import MAX_FILE, value_problem
    from sidecar.security import tokens

    try:
        value = tokens.read_token_file(f"--secret {secret.name}", secret.path, MAX_FILE)
    except tokens.TokenError as exc:
        raise SecretError(str(exc)) from None
    why = value_problem(value)
    if why is not None:
        raise SecretError(f"--secret {secret.name}: the value in {secret.path} {why}")
    return SecretArg(secret.name, secret.env, secret.hosts, secret.path, value)


def on_allowlist(secret: SecretArg, allow: Sequence[str]) -> str | None:
    """The first of the secret's hosts the allowlist `allow` does not let the CLI reach."""
    from sidecar.config.secrets import covers
    from sidecar.egress.allowlist import parse_pattern

    patterns = [parse_pattern("--egress", text) for text in allow]
    for text in secret.hosts:
        host = parse_pattern("--secret", text)
        if not any(covers(p, host) for p in patterns):
            return text
    return None


def parse_all(specs: Sequence[str], egress: tuple[str, ...] | None) -> tuple[SecretArg, ...]:
    """Every `--secret`, checked together (no name or variable twice, each host on the `egress`
    allowlist; None: the network is open, which a secret cannot go with), then each file read."""
    found: list[SecretArg] = []
    for spec in specs:
        secret = parse(spec)
        for other in found:
            if other.name == secret.name:
                raise SecretError(f"--secret {secret.name} is given twice")
            if other.env == secret.env:
                msg = f"--secret {other.name} and --secret {secret.name} both set {secret.env}"
                raise SecretError(msg)
        if egress is None:
            msg = (
                f"--secret {secret.name} needs an egress allowlist (the sidecar's proxy is the "
                "only way a real value goes out): drop --egress open"
            )
            raise SecretError(msg)
        missing = on_allowlist(secret, egress)
        if missing is not None:
            msg = f"--secret {secret.name}: host {missing} is not on the --egress allowlist"
            raise SecretError(msg)
        found.append(secret)
    return tuple(read_value(s) for s in found)


def with_hosts(egress: tuple[str, ...], specs: Sequence[str]) -> tuple[str, ...]:
    """The default allowlist with the hosts of every `--secret` it does not cover yet (a
    secret's host is an API the user means the CLI to reach, as a `*_BASE_URL`'s host is)."""
    added: list[str] = []
    for spec in specs:
        secret = parse(spec)
        while (missing := on_allowlist(secret, (*egress, *added))) is not None:
            added.append(missing)
    return (*egress, *added)


def secrets_yaml(secrets: Sequence[SecretArg], files: str | None) -> str:
    """SIDECAR_SECRETS_FILE's text: each value in `files`/NAME, or (`files` None) in the
    sidecar's variable `from_env`. No value is ever in it. JSON (which is YAML), compact with
    sorted keys: the Helm chart's `toJson` writes the same text."""
    import json

    entries = []
    for s in secrets:
        source = {"file": f"{files}/{s.name}"} if files else {"from_env": s.from_env}
        entries.append({"name": s.name, "env": s.env, **source, "hosts": list(s.hosts)})
    return json.dumps({"secrets": entries}, sort_keys=True, separators=(",", ":"))


def git_env(secrets: Sequence[SecretArg]) -> dict[str, str]:
    """git's configuration (GIT_CONFIG_COUNT/KEY_n/VALUE_n: the environment's own scope) that
    makes `git push https://github.com/...` send the github secret's placeholder as its Basic
    password; the proxy puts the real token in its place. {} without a github secret. The
    empty helper first clears any helper of the user's own for that URL."""
    github = next((s for s in secrets if s.name == GIT_SECRET), None)
    if github is None:
        return {}
    key = f"credential.{GIT_URL}.helper"
    helper = (
        '!f() { test "$1" = get || exit 0; echo username=x-access-token; '
        f'echo "password=${github.env}"; }}; f'
    )
    return {
        "GIT_CONFIG_COUNT": "2",
        "GIT_CONFIG_KEY_0": key,
        "GIT_CONFIG_VALUE_0": "",
        "GIT_CONFIG_KEY_1": key,
        "GIT_CONFIG_VALUE_1": helper,
    }
