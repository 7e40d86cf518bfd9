"""tmux's control-mode protocol, the side a client reads (tmux(1), CONTROL MODE): the bytes a
`tmux -C` client prints, cut into the panes that wrote (`%output`), what one pane wrote (its
bytes, unescaped) and the framed replies to the commands it was sent. Pure: bytes in, events
out, whatever the chunks' boundaries.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

# Outside a reply only a line's head matters (which notification, which pane): a longer line
# (an `%output` of a big write) is kept only this far while it is incomplete, unless its pane's
# bytes are wanted (`feed`'s `keep`); then up to LINE, past which the line's bytes are lost.
HEAD = 128
LINE = 4 * 1024 * 1024


def unescape(data: bytes) -> bytes:
    """An `%output` line's data as the pane wrote it. tmux escapes every byte below 32 and the
    backslash as a backslash and three octal digits, and nothing else, so that a backslash
    always starts such an escape: Python's escape decoder (C) reads exactly those."""
    if b"\\" not in data:
        return data
    return codecs.escape_decode(data)[0]


class ControlError(Exception):
    """A command sent through the control client got no usable answer."""


class NotAttached(ControlError):
    """No control client is attached (tmux restarting, a heal, a resleeve's new server)."""


class NoAnswer(ControlError):
    """tmux did not answer in time."""


class CommandFailed(ControlError):
    """tmux answered with `%error` (its message is the exception's)."""


@dataclass(frozen=True)
class Reply:
    """One command's answer: its output lines, between `%begin` and `%end` (`ok`) or `%error`."""

    ok: bool
    lines: tuple[bytes, ...]
    ours: bool  # flags 1: a command read from this client's input (0: its attach-session)

    def text(self) -> str:
        return "\n".join(line.decode("utf-8", "replace") for line in self.lines)


class ControlReader:
    """Feed it what the client prints, in chunks cut anywhere; it returns what completed.

    A reply's body is the command's output unescaped (capture-pane prints the pane's lines as
    they are), so a body line may read `%end ...` or `%output ...`. What makes the end
    unambiguous: tmux closes a reply with `%end` or `%error` followed by the very time, number
    and flags of its `%begin`, and notifications never come inside a reply."""

    def __init__(self) -> None:
        self._pending = b""  # an incomplete last line
        self._guard: bytes | None = None  # " <time> <number> <flags>" of the open reply
        self._body: list[bytes] = []
        self.lost = 0  # bytes of `keep`'s pane lost in lines longer than LINE
        self._cut = False  # the pending line was cut to its head: its data is lost

    def feed(self, data: bytes, keep: bytes | None = None) -> tuple[set[bytes], list[Reply], bytes]:
        """The panes (`%N`) that wrote, the replies that ended in what came so far, and what
        the pane `keep` wrote (b"" unless `keep` is given)."""
        panes: set[bytes] = set()
        replies: list[Reply] = []
        kept: list[bytes] = []
        lines = (self._pending + data).split(b"\n")
        pending = lines.pop()
        cut, self._cut = self._cut and bool(lines), self._cut and not lines
        for line in lines:
            guard = self._guard
            if guard is not None:
                head = line[: -len(guard)]
                if head in (b"%end", b"%error") and line.endswith(guard):
                    ours = guard.rsplit(b" ", 1)[1] == b"1"
                    replies.append(Reply(head == b"%end", tuple(self._body), ours))
                    self._guard, self._body = None, []
                else:
                    self._body.append(line)
            elif line.startswith((b"%output ", b"%extended-output ")):
                pane = line.split(b" ", 2)[1]
                panes.add(pane)
                if pane == keep and not cut:
                    kept.append(_payload(line))
            elif line.startswith(b"%begin "):
                self._guard = line[6:]
            # Other notifications (%session-changed, %pause, %exit, ...) are of no use here.
            cut = False  # only the first line can be the one that was cut
        if self._guard is None and len(pending) > (HEAD if keep is None else LINE):
            if keep is not None:
                self.lost += len(pending) - HEAD
                self._cut = True
            pending = pending[:HEAD]
        self._pending = pending
        return panes, replies, unescape(b"".join(kept)) if kept else b""


def _payload(line: bytes) -> bytes:
    """The escaped data of an `%output %N DATA` or `%extended-output %N AGE ... : DATA` line."""
    if line.startswith(b"%output "):
        return line.split(b" ", 2)[2] if line.count(b" ", 0, 32) >= 2 else b""
    _, sep, data = line.partition(b" : ")
    return data if sep else b""
