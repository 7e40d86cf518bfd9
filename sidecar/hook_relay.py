"""`python -I .../sidecar/hook_relay.py SETTINGS_FILE EVENT`: a command hook that relays its event
to the sidecar's hook route the way an HTTP hook would, and prints the reply (a held permission
request's answer) for the CLI to read: for CLIs whose hooks are commands (Gemini CLI) and for
Claude Code's SessionStart (it runs no HTTP hooks for that event). Standard library only.
"""

from __future__ import annotations

import json
import shlex
import sys
import urllib.request
from pathlib import Path
from typing import Any

# The URL and secret come from the settings file the sidecar wrote for this CLI (readable by the
# CLI's user only), never from an argv: the first mapping in it with a `url` and `headers` (an
# HTTP hook's, or a section of our own). It exits 0 whatever happens and gives up after
# TIMEOUT: a slow or dead sidecar never holds up the CLI. Nothing is printed unless the sidecar
# replied with a body (a SessionStart hook's output would go into the model's context).
TIMEOUT = 1.0
MAX_INPUT = 1024 * 1024


def command(settings_path: Path, event: str) -> str:
    """The hook's shell command: this interpreter, isolated (-I: no PYTHONPATH, no user site),
    runs this file by its path, so it needs nothing importable."""
    return shlex.join(
        [sys.executable, "-I", str(Path(__file__).resolve()), str(settings_path), event]
    )


def _target(document: Any) -> tuple[str, dict[str, str]] | None:
    """The first {"url", "headers"} mapping in the document, depth first."""
    if isinstance(document, dict):
        url, headers = document.get("url"), document.get("headers")
        if isinstance(url, str) and isinstance(headers, dict):
            return url, {str(k): str(v) for k, v in headers.items()}
        children: Any = document.values()
    elif isinstance(document, list):
        children = document
    else:
        return None
    for child in children:
        if (found := _target(child)) is not None:
            return found
    return None


def main(argv: list[str]) -> int:
    try:
        payload = sys.stdin.buffer.read(MAX_INPUT)
        with open(argv[1], encoding="utf-8") as fh:
            target = _target(json.load(fh))
        if target is None:
            return 0
        url = target[0].rsplit("/", 1)[0] + "/" + argv[2]
        request = urllib.request.Request(url, data=payload, method="POST", headers=target[1])  # noqa: S310 - our own loopback URL
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
            reply = response.read(MAX_INPUT)
        if reply:
            sys.stdout.buffer.write(reply)
    except Exception:  # noqa: S110 - a failed relay must never disturb the CLI
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
