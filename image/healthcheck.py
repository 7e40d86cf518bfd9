"""Docker HEALTHCHECK: healthy while the sidecar answers GET /health with 200.

`degraded` (the CLI is not running) still counts as healthy to Docker: the sidecar is up and can
be asked to resleeve; restarting the container would lose the tmux scrollback for nothing.
"""

import os
import sys
import urllib.request

host = os.environ.get("SIDECAR_HOST", "")
if host in ("0.0.0.0", "::", ""):  # noqa: S104 - a wildcard bind is reached on loopback
    host = "127.0.0.1"
if ":" in host:
    host = f"[{host}]"
url = f"http://{host}:{os.environ.get('SIDECAR_PORT', '8080')}/health"
try:
    with urllib.request.urlopen(url, timeout=5) as resp:
        sys.exit(0 if resp.status == 200 else 1)
except OSError as exc:
    print(f"{url}: {exc}", file=sys.stderr)
    sys.exit(1)
