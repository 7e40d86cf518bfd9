"""Message files: parse a 10,000-message outbox; ack (remove) one id in a 10,000-message file.

Measured in-process through `sidecar.workspace.mailbox.Mailbox`, the code behind /outbox and
/outbox/ack: with a fresh Mailbox each time (nothing cached: the target), and right after a
read by the same Mailbox (what an envoy reading then acking gets).
"""

from __future__ import annotations

import time

from bench.context import Context
from bench.core import Figure, at_most, interleave
from bench.messages import message, write_outbox
from bench.procs import BenchError
from sidecar.workspace.mailbox import Mailbox

NAMES = ("outbox.parse", "outbox.ack", "outbox.ack_after_read")
COUNT = 10_000


def run(ctx: Context) -> list[Figure]:
    workspace = ctx.scratch("ob")
    path = write_outbox(workspace, COUNT)
    text = path.read_bytes()
    middle = message(COUNT // 2).id

    def parse() -> float:
        path.write_bytes(text)  # the full file again (an ack took one out), outside the timing
        start = time.perf_counter()
        got = Mailbox(workspace, "outbox").read()
        took = time.perf_counter() - start
        if len(got.messages) != COUNT:
            msg = f"parsed {len(got.messages)} messages, wanted {COUNT}"
            raise BenchError(msg)
        return took

    def ack() -> float:
        path.write_bytes(text)  # the full file again, outside the timing
        start = time.perf_counter()
        result = Mailbox(workspace, "outbox").remove([middle])
        took = time.perf_counter() - start
        if result.removed != 1:
            msg = f"ack removed {result.removed} messages, wanted 1"
            raise BenchError(msg)
        return took * 1000

    def ack_after_read() -> float:
        # What the API does: one long-lived Mailbox; the envoy reads the outbox, then acks.
        path.write_bytes(text)
        mailbox = Mailbox(workspace, "outbox")
        mailbox.read()
        start = time.perf_counter()
        result = mailbox.remove([middle])
        took = time.perf_counter() - start
        if result.removed != 1:
            msg = f"ack removed {result.removed} messages, wanted 1"
            raise BenchError(msg)
        return took * 1000

    got = interleave(
        ctx.pick(3, 15), {"parse": parse, "ack": ack, "ack_after_read": ack_after_read}
    )
    size = f"{len(text) / 1e6:.1f} MB file"
    return [
        Figure(
            "outbox.parse",
            f"outbox: parse {COUNT:,} messages",
            "s",
            got["parse"],
            target=at_most(0.3, "≤0.3 s"),
            notes=size,
        ),
        Figure(
            "outbox.ack",
            f"outbox: ack one id in a {COUNT:,}-message file",
            "ms",
            got["ack"],
            target=at_most(50, "≤50 ms"),
            notes=f"{size}; a fresh Mailbox, nothing cached",
        ),
        Figure(
            "outbox.ack_after_read",
            f"outbox: ack one id in a {COUNT:,}-message file, right after a read",
            "ms",
            got["ack_after_read"],
            notes=f"{size}; the same Mailbox read the file first, as GET /outbox does",
        ),
    ]
