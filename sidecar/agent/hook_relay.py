"""`python -I .../sidecar/hook_relay.py SETTINGS_FILE EVENT`: a command hook that relays one
event to the sidecar's hook route the way an HTTP hook would, and prints the sidecar's reply (a
held permission request's answer) for the CLI to read: for CLIs whose hooks are commands (Codex,
Gemini CLI) and for the events that run no HTTP hooks (Claude Code's SessionStart). Standard
library only, run by its file.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

# The URL and secret come from the settings file the sidecar wrote for this CLI (readable by the
# CLI's user only), never from an argv: its `sidecar` section where it has one (a document that
# also carries an administrator's hooks), else the first mapping in it with a `url` and
# `headers` (an HTTP hook's, all of them ours). It always exits 0, prints only a 200 reply's body (a
# SessionStart hook's output would go into the model's context) and gives up after the event's
# own HTTP hook timeout, where the document gives one, else TIMEOUT: a slow or dead sidecar
# never holds up the CLI. http.client rather than urllib.request: the CLI waits for each hook,
# and the relay's start (the interpreter and its imports) is most of what a hook costs it.
TIMEOUT = 1.0
MAX_INPUT = 1024 * 1024


def command(settings_path: Path, event: str) -> str:
    """The hook's shell command: this interpreter, isolated (-I: no PYTHONPATH, no user site),
    runs this file by its path, so it needs nothing importable and is the running sidecar's."""
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


def _timeout(document: Any, event: str) -> float:
    """The timeout of `event`'s own HTTP hook in a settings document, else TIMEOUT."""
    try:
        for entry in document["hooks"][event]:
            for hook in entry["hooks"]:
                if hook.get("type") == "http" and "timeout" in hook:
                    return float(hook["timeout"])
    except (KeyError, TypeError, AttributeError):
        pass
    return TIMEOUT


def target(settings_path: str, event: str) -> tuple[str, dict[str, str], float] | None:
    """URL, headers and timeout to relay `event` with (None: the file names no hook URL)."""
    with open(settings_path, encoding="utf-8") as fh:
        document = json.load(fh)
    ours = document.get("sidecar") if isinstance(document, dict) else None
    found = _target(ours) or _target(document)
    if found is None:
        return None
    url, headers = found
    return url.rsplit("/", 1)[0] + "/" + event, headers, _timeout(document, event)


def main(argv: list[str]) -> int:
    # Here, not at the top: the CLI packages import this module for `command`, and so does the
    # init process (the registry); http.client and its email parser cost it ~6 MB.
    import http.client
    from urllib.parse import urlsplit

    try:
        payload = sys.stdin.buffer.read(MAX_INPUT)
        found = target(argv[1], argv[2])
        if found is None:
            return 0
        url, headers, timeout = found
        where = urlsplit(url)
        connection = http.client.HTTPConnection(where.netloc, timeout=timeout)
        connection.request(
            "POST",
            where.path,
            body=payload,
            headers={**headers, "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        reply = response.read()
        if response.status == 200:
            sys.stdout.buffer.write(reply)
            sys.stdout.flush()
    except Exception:  # noqa: S110 - a failed relay must never disturb the CLI
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
