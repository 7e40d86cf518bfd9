"""`python -I .../sidecar/hook_relay.py SETTINGS_FILE EVENT`: a command hook that relays one
event to the sidecar the way an HTTP hook would, and prints the sidecar's reply for the CLI to
read: for CLIs whose hooks are commands (Codex) and for the events that run no HTTP hooks
(Claude Code's SessionStart). Standard library only, run by its file.
"""

from __future__ import annotations

import http.client
import json
import sys
from typing import Any
from urllib.parse import urlsplit

# The URL and secret come from the settings file the sidecar wrote for this CLI (readable by the
# CLI's user only, in the HTTP hooks' format: an event's `url`, `headers` and `timeout`), never
# from an argv. It always exits 0, prints only a 200 reply's body and gives up after the event's
# own timeout (TIMEOUT when it names none): a slow or dead sidecar never holds up the CLI.
# http.client rather than urllib.request: the CLI waits for each hook, and the relay's start
# (the interpreter and its imports) is most of what a hook costs it.
TIMEOUT = 1.0
MAX_INPUT = 1024 * 1024


def _http_hooks(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each event's HTTP hook in a settings document."""
    found: dict[str, dict[str, Any]] = {}
    for event, entries in document["hooks"].items():
        for entry in entries:
            for hook in entry["hooks"]:
                if hook.get("type") == "http":
                    found.setdefault(event, hook)
    return found


def target(settings_path: str, event: str) -> tuple[str, dict[str, str], float] | None:
    """URL, headers and timeout for `event`: its own HTTP hook, else another's URL for it."""
    with open(settings_path, encoding="utf-8") as fh:
        hooks = _http_hooks(json.load(fh))
    hook = hooks.get(event)
    timeout = float(hook["timeout"]) if hook is not None and "timeout" in hook else TIMEOUT
    hook = hook or next(iter(hooks.values()), None)
    if hook is None:
        return None
    url = str(hook["url"]).rsplit("/", 1)[0] + "/" + event
    return url, {str(k): str(v) for k, v in hook.get("headers", {}).items()}, timeout


def main(argv: list[str]) -> int:
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
