"""Realistic message files for the outbox figures, written with the sidecar's own renderer."""

from __future__ import annotations

from pathlib import Path

from sidecar.workspace.mailbox import NEEDLECAST_DIR
from sidecar.workspace.needlecast import Message, render_messages

KINDS = ("milestone", "question", "response", "blocked", "task", "directive")


def message(i: int) -> Message:
    body = (
        f"## Update {i}\n\nFinished step {i} of the plan; tests pass.\n\n"
        f"- changed `src/module_{i % 17}.py`\n- next: step {i + 1}\n"
    )
    return Message(
        id=f"msg-{i:012x}",
        sender="sleeve-bench",
        type=KINDS[i % len(KINDS)],
        time="2026-01-01T00:00:00Z",
        body=body,
        to="envoy",
        thread=f"thread-{i % 50}",
    )


def write_outbox(workspace: Path, count: int) -> Path:
    """`<workspace>/.needlecast/outbox.md` holding `count` messages; returns its path."""
    path = workspace / NEEDLECAST_DIR / "outbox.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_messages(message(i) for i in range(count)), encoding="utf-8")
    return path
