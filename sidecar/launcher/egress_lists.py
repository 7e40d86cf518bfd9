"""The egress allowlist a sleeve gets from `sleeve run/manifest --egress default|open|FILE`:
the shipped default (one data file, `egress-default.txt`, with a part per CLI), the user's own
file, or none at all. Patterns are checked here with the sidecar's own parser, so that a bad
one fails on the host, not as a sleeve that exits 2."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from importlib import resources

from sidecar.egress.allowlist import AllowlistError, parse_list, read_file, split_file
from sidecar.launcher.fsutil import LauncherError

DEFAULT = "default"
OPEN = "open"
DATA_FILE = "egress-default.txt"
_SECTION = re.compile(r"^#\s*\[([A-Za-z0-9_.-]+)\]\s*$")


class EgressChoiceError(LauncherError):
    """--egress names a file that cannot be read or holds a bad pattern."""


def default_text() -> str:
    return resources.files("sidecar.launcher").joinpath(DATA_FILE).read_text(encoding="utf-8")


def default_patterns(cli: str, text: str | None = None) -> tuple[str, ...]:
    """The default list for `cli`: the part for every CLI, then `cli`'s own part."""
    parts: dict[str, list[str]] = {"": []}
    current = ""
    for line in (default_text() if text is None else text).splitlines():
        section = _SECTION.match(line.strip())
        if section:
            current = section.group(1)
            parts.setdefault(current, [])
        else:
            parts[current] += split_file(line)
    chosen = [*parts[""], *parts.get(cli, [])]
    return tuple(parse_list(f"{DATA_FILE} [{cli}]", chosen).texts)


def base_url_patterns(env: Mapping[str, str]) -> list[str]:
    """The hosts the CLI is pointed at by `*_BASE_URL` variables it is given (a model API of the
    user's choosing is its model API): `host[:port]`, the port only when the URL names one."""
    found = []
    for name, value in sorted(env.items()):
        if not name.endswith("_BASE_URL"):
            continue
        url = urllib.parse.urlsplit(value)
        if url.scheme in ("http", "https") and url.hostname:
            host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
            found.append(f"{host}:{url.port}" if url.port else host)
    return found


def choose(spec: str, cli: str, env: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The patterns of `--egress spec` (None: the network is open). An empty tuple is a list
    that allows nothing (a file holding only `none`). The default adds the hosts of the
    `*_BASE_URL` variables in `env`, the CLI's environment."""
    if spec == OPEN:
        return None
    if spec == DEFAULT:
        extra = base_url_patterns(env or {})
        listed = default_patterns(cli)
        return (*listed, *(p for p in extra if p not in listed))
    try:
        patterns = read_file("--egress (give default, open or a file)", spec)
        return tuple(parse_list(f"--egress {spec}", patterns).texts)
    except AllowlistError as exc:
        raise EgressChoiceError(str(exc)) from None
