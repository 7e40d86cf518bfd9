"""`python -I -m sidecar.hook_relay SETTINGS_FILE`: Claude Code's SessionStart command hook (it
runs no HTTP hooks for that event), which relays the event to the sidecar the way the HTTP hooks
do. Standard library only.
"""

from __future__ import annotations

import json
import sys
import urllib.request

# The URL and secret come from the settings file the sidecar wrote for this CLI (readable by the
# CLI's user only), never from an argv. It prints nothing (a SessionStart hook's output would go
# into the model's context), always exits 0 and gives up after a second: a slow or dead sidecar
# never holds up the CLI.
TIMEOUT = 1.0
MAX_INPUT = 1024 * 1024


def _target(settings_path: str) -> tuple[str, dict[str, str]] | None:
    with open(settings_path, encoding="utf-8") as fh:
        document = json.load(fh)
    for entry in document["hooks"]["Stop"]:
        for hook in entry["hooks"]:
            if hook.get("type") == "http":
                url = str(hook["url"]).rsplit("/", 1)[0] + "/SessionStart"
                return url, {str(k): str(v) for k, v in hook.get("headers", {}).items()}
    return None


def main(argv: list[str]) -> int:
    try:
        payload = sys.stdin.buffer.read(MAX_INPUT)
        target = _target(argv[1])
        if target is None:
            return 0
        url, headers = target
        request = urllib.request.Request(url, data=payload, method="POST", headers=headers)  # noqa: S310 - our own loopback URL
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=TIMEOUT):  # noqa: S310
            pass
    except Exception:  # noqa: S110 - a failed relay must never disturb the CLI
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
