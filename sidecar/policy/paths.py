"""Paths for the policy's `path` globs: a glob compiled to a regex over a path relative to the
workspace (`*` within a segment, `**` across segments), and a tool's path resolved against the
workspace the way the kernel will (`..` and symlinks followed), so that a path leading out of it
is known to be outside and matches no glob.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

MAX_GLOB = 1024


class GlobError(ValueError):
    """A glob that cannot be a path in the workspace."""


def compile_glob(glob: str) -> re.Pattern[str]:
    """A regex matching the workspace-relative paths `glob` names: `*` is any run of characters
    but `/`, `?` one of them, `[...]` a class, `**` any number of whole segments. GlobError for
    a glob that is empty, absolute, home-relative or climbs out with `..`."""
    if not glob or len(glob) > MAX_GLOB or "\x00" in glob:
        msg = "a path glob is 1 to 1024 characters, no NUL"
        raise GlobError(msg)
    if glob.startswith(("/", "~")):
        msg = f"{glob!r} is not relative to the workspace (globs never name paths outside it)"
        raise GlobError(msg)
    if ".." in PurePosixPath(glob).parts:
        msg = f"{glob!r} climbs out of the workspace with '..' (globs never leave it)"
        raise GlobError(msg)
    return re.compile(_translate(glob.removeprefix("./")), re.DOTALL)


def _translate(glob: str) -> str:
    out: list[str] = []
    at = 0
    while at < len(glob):
        char = glob[at]
        if glob.startswith("**/", at):
            out.append("(?:[^/]*/)*")  # zero or more whole segments
            at += 3
        elif glob.startswith("**", at):
            out.append(".*")
            at += 2
        elif char == "*":
            out.append("[^/]*")
            at += 1
        elif char == "?":
            out.append("[^/]")
            at += 1
        elif char == "[" and (end := glob.find("]", at + 2)) > 0:
            body = glob[at + 1 : end]
            negate = body.startswith("!")
            body = re.escape(body[1:] if negate else body).replace("\\-", "-")
            out.append(f"[{'^/' if negate else ''}{body}]")
            at = end + 1
        else:
            out.append(re.escape(char))
            at += 1
    return "".join(out) + r"\Z"


def inside(workspace: str, path: str) -> str | None:
    """`path` (absolute, or relative to the workspace) relative to the workspace once `..` and
    every symlink that exists are resolved ('.' for the workspace itself); None when it leads
    outside. Call it as the CLI's user: what the kernel lets that user follow is what counts."""
    if not path or "\x00" in path:
        return None
    root = os.path.realpath(workspace)
    full = os.path.realpath(
        os.path.join(root, os.path.expanduser(path) if path[0] == "~" else path)
    )
    if full == root:
        return "."
    if not full.startswith(root.rstrip("/") + "/"):
        return None
    return full[len(root.rstrip("/")) + 1 :]
