"""Sample messages and message files shared by the needlecast format and mailbox tests."""

from __future__ import annotations

import pathlib

from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import Message

SEED = """---
id: msg-abc123
from: bob
to: alice
thread: auth-help
type: question
time: 2026-01-21T10:00:00Z
---
Need help understanding the JWT implementation.
Can you review my approach?

---
id: msg-abc124
from: envoy
to: alice
type: directive
time: 2026-01-21T09:30:00Z
---
Please prioritize the authentication module.
"""


def msg(ident: str, body: str = "hello", **kw: str | None) -> Message:
    fields: dict[str, str | None] = {
        "sender": "alice",
        "type": "task",
        "time": "2026-01-21T10:00:00Z",
        **kw,
    }
    return Message(id=ident, body=body, **fields)


def box_file(tmp_path: pathlib.Path, text: str | bytes, name: str = "outbox") -> Mailbox:
    d = tmp_path / ".needlecast"
    d.mkdir(exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    (d / f"{name}.md").write_bytes(data)
    return Mailbox(tmp_path, name)
