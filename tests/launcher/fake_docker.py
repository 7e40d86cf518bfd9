"""A stand-in `docker` client for the launcher tests, at the OS seam only.

No Docker engine runs on the test machines (the image tests start a private one); this script
records every call (argv + which variables it got, and for `cp -` the names and modes in the tar
it was given, not their contents) to $FAKE_DOCKER_LOG and answers like the client would.
`start` (of a container `create` made) starts a tiny real HTTP server on the published port,
so `sleeve run` waits on a real /health, and records its pid in $FAKE_DOCKER_LOG.pids. The
commands named in $FAKE_DOCKER_HANG (comma-separated: `create,stop`) never answer, like a
wedged engine.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile

SERVER = """
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        # /health's answer, and the CLI's state /status gives (what `sleeve run` waits for).
        body = json.dumps({"status": "healthy", "uptime": 0, "cli_state": "running"}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def main() -> int:
    args = sys.argv[1:]
    log = os.environ["FAKE_DOCKER_LOG"]
    entry: dict[str, object] = {"argv": args, "env": sorted(os.environ)}
    if args[:2] == ["cp", "-"]:
        with tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read())) as tar:
            entry["tar"] = [[m.name, oct(m.mode), m.uid, m.size] for m in tar.getmembers()]
    with open(log, "a") as fh:
        fh.write(json.dumps(entry) + "\n")
    command = args[0] if args else ""
    if command and command in os.environ.get("FAKE_DOCKER_HANG", "").split(","):
        signal.pause()  # until the caller's timeout kills us
    if command == "version":
        print("27.0.0")
    elif command == "ps":
        print(os.environ.get("FAKE_DOCKER_PS", ""), end="")
    elif command == "inspect":
        print("running")
    elif command == "create":
        name = args[args.index("--name") + 1]
        with open(f"{log}.{name}.create", "w") as fh:
            json.dump(args, fh)
        print("0123456789ab")
    elif command == "start":
        with open(f"{log}.{args[1]}.create") as fh:
            created = json.load(fh)
        publish = created[created.index("--publish") + 1]
        port = publish.split(":")[1]
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, port],
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open(log + ".pids", "a") as fh:
            fh.write(f"{server.pid}\n")
        print(args[1])
        server.returncode = 0  # detached on purpose; stop the Popen destructor from warning
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
