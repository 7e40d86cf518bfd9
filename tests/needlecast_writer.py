"""Writer process for the needlecast concurrency and crash tests (run as a script).

needlecast_writer.py append WORKSPACE NAME WRITER COUNT   append COUNT messages, print "done"
needlecast_writer.py append-big WORKSPACE COUNT           append COUNT 1 MiB messages
needlecast_writer.py rewrite-loop WORKSPACE               remove outbox messages one by one
needlecast_writer.py rewrite-pause WORKSPACE ID           remove ID, stop just before rename
"""

from __future__ import annotations

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from sidecar.core.contract import rfc3339
from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import Message

BIG_BODY = ("0123456789abcdef" * 64 + "\n") * 1000  # ~1 MiB


def body_for(ident: str) -> str:
    """A body that would break a naive splitter; the tests check it comes back unchanged."""
    return f"message {ident}\n---\nid: fake-{ident}\ntype: task\n---\n✓ ünïcode\r\nend"


def message(ident: str, body: str) -> Message:
    return Message(id=ident, sender="writer", type="milestone", time=rfc3339(ms=False), body=body)


def main(argv: list[str]) -> None:
    mode, workspace = argv[0], pathlib.Path(argv[1])
    if mode == "append":
        box = Mailbox(workspace, argv[2])
        writer, count = argv[3], int(argv[4])
        for i in range(count):
            ident = f"w{writer}-{i:05d}"
            box.append(message(ident, body_for(ident)))
        print("done", flush=True)
    elif mode == "append-big":
        box = Mailbox(workspace, "outbox")
        for i in range(int(argv[2])):
            box.append(message(f"big-{i}", BIG_BODY))
    elif mode == "rewrite-loop":
        box = Mailbox(workspace, "outbox")
        for m in box.read().messages:
            box.remove([m.id])
    elif mode == "rewrite-pause":
        real_replace = os.replace

        def paused_replace(*args: object, **kwargs: object) -> None:
            # The temp file is complete and fsynced; the rename has not happened yet.
            print("paused", flush=True)
            sys.stdin.read()  # block until killed
            real_replace(*args, **kwargs)  # type: ignore[arg-type]

        os.replace = paused_replace  # type: ignore[assignment]
        Mailbox(workspace, "outbox").remove([argv[2]])


if __name__ == "__main__":
    main(sys.argv[1:])
