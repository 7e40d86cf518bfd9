"""The CLI's own variables as a file (`Layout.cli_env`): one NAME=VALUE a line, backslashes and
newlines escaped the way `printf %b` reads them back. The pane's waiter exports them (an open
network), or the egress guard gives them to the CLI alone (`parse`). Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ESCAPE = re.compile(r"\\(\\|n)")


def text(env: Mapping[str, str]) -> str:
    """`env` as the file holds it."""
    lines = []
    for name, value in env.items():
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"{name}={escaped}\n")
    return "".join(lines)


def parse(data: str) -> dict[str, str]:
    """The variables of a file `text` wrote; a line without a valid name is left out."""
    env = {}
    for line in data.split("\n"):
        name, sep, value = line.partition("=")
        if sep and _NAME.match(name):
            env[name] = _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else "\\", value)
    return env
