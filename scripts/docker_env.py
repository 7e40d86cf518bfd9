"""`scripts/docker-env start|stop`: the private Docker engine of the end-to-end tests, by hand.

`start` prints the `export DOCKER_HOST=...` line for the shell to eval (everything else goes to
stderr); `stop` stops the engine by its pid, unless a test run holds it.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.e2e import dockerenv  # after the sys.path line: the checkout root must be on it


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "start"
    root = dockerenv.cache_root() / "engine"
    sock = root / "docker.sock"
    if cmd == "start":
        engine = dockerenv.Engine(root=root, sock=sock, pid=0)
        if not engine.ping():
            engine = dockerenv.start_engine(root)
            print(f"# dockerd pid {engine.pid}, log {root / 'dockerd.log'}", file=sys.stderr)
        print(f"# base image: {dockerenv.ensure_base_image(engine)}", file=sys.stderr)
        dockerenv.prepare_context()
        print(f"export DOCKER_HOST=unix://{sock} DOCKER_BUILDKIT=0")
        return 0
    if cmd == "stop":
        try:
            pid = int((root / "dockerd.pid").read_text())
        except (OSError, ValueError):
            print("no private dockerd is running", file=sys.stderr)
            return 1
        # A test run holds the engine's lock for its whole session: never pull the engine away
        # from under it.
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(dockerenv.file_lock(root.parent / "engine.lock", timeout=0))
            except TimeoutError:
                msg = f"a test run is using the dockerd at {sock}; not stopping it"
                print(msg, file=sys.stderr)
                return 1
            dockerenv.Engine(root=root, sock=sock, pid=pid).stop()
        return 0
    print("usage: scripts/docker-env start|stop", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
