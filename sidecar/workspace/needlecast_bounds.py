"""Where each message of a needlecast file begins and ends: the boundary rule, on the file's
bytes. Pure; `sidecar.workspace.needlecast` reads the headers and bodies it finds.

Boundary rule
-------------
A message is an opening ``---`` line, YAML header lines, a closing ``---`` line, then the body.

* A *separator* is a line holding only ``---`` (trailing spaces/tabs and a CR before the LF are
  tolerated, so CRLF files parse).
* A *header line* is a ``key: value`` line (``key:`` = letters, digits, ``_``, ``-``, then a
  space, a tab or the line end), an indented line, a ``#`` comment or a ``- item`` line. A blank
  line is not one, nor is a separator.
* A separator whose next line is a ``key:`` line is a *candidate*. Its header is the run of
  header lines from there; it is *closed* when the line right after the run is a separator, and
  that separator closes it. The body runs from the closing separator to the next message or
  skipped header (below), or the end of the file. A separator that is not a candidate is body
  text (a hand-written markdown rule).
* A closing separator can be a closed candidate in turn (a body that starts with ``key: value``
  lines right up to a ``---``; an unclosed header right before a message): closed candidates
  linked like this form a *chain*, which pairs up into messages (opening, closing separator).
  Odd number of links: they pair up from the first separator. Even: one separator is left over;
  if the chain's last header has a contract field line (``id:``, ``from:``, ``to:``, ``thread:``,
  ``type:``, ``time:``) the pairing runs from the end, and the first header is *unclosed*;
  otherwise it runs from the start and the last separator is body text (a ``---`` under a
  ``Status: done`` body line). Chains of one link, i.e. every message the writer writes, are the
  plain case.
* An unclosed header (a candidate whose run meets a blank line, a line that is no header line or
  the end of the file first, or the first of an even chain as above) is skipped up to the next
  message and reported as "line N: header is never closed ..." naming the line where it stops. It
  belongs to no message: an ack of a neighbour leaves it in the file.
* Escaping: when writing, a body line made of zero or more backslashes and a separator gets one
  more leading backslash; reading takes one away. No written body line is therefore ever a
  separator, and any body round-trips (``---`` lines, YAML-looking text, CRLF, no final newline).
* The writer ends every message with ``"\\n\\n"`` (line end plus a blank line) and reading removes
  exactly that; for hand-written files it removes ``"\\r\\n\\r\\n"``, ``"\\r\\n"`` or ``"\\n"``.
  An append first ends the file with a blank line if it does not already (the last body reads the
  same: :func:`blank_line_after`).

What this guarantees: a written message's closing separator is never a closed candidate (its
body holds no separator and a blank line follows it), so the message is the last link of its
chain; its header has an ``id:`` line, so it is paired whatever text stands before it (if that
text ends with a line end, which append sees to). Every message the writer wrote is read back
with its header and its body as written (followed by any text after it that is neither a message
nor an unclosed header). A header left unclosed by a foreign writer killed mid-write, or by a
hand edit, never swallows the next message.
"""

from __future__ import annotations

import re
from typing import NamedTuple

#: A separator line, without its line end; a header key.
SEP_LINE = r"---[ \t]*\r?$"
KEY = r"[A-Za-z_][A-Za-z0-9_-]*"
#: Values YAML reads back as the very same string: a word starting with a letter (minus YAML
#: 1.1's bool/null words) or a timestamp (needlecast's YAML loader keeps those as the text
#: written). Headers made of such lines skip the YAML parser, which is what makes 10k messages
#: fast.
PLAIN_VALUE = r"[A-Za-z][A-Za-z0-9_-]*|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"
# Header lines (see the boundary rule): a `key:` line, an indented line, a `#` comment or a
# `- item` line. A separator or a blank line is none of these.
_KEY_LINE = rf"{KEY}:(?:[ \t\r][^\n]*)?\n"
_HEADER_LINE = rf"(?:{KEY}:(?:[ \t\r][^\n]*)?|[ \t]+[^ \t\r\n][^\n]*|#[^\n]*|-(?:[ \t\r][^\n]*)?)\n"
_BLANK_LINE = r"[ \t]*\r?\n"
# A header: a key line, then header lines. Possessive: linear, no backtracking; a run that
# stops anywhere but at a separator is not closed.
_RUN = rf"{_KEY_LINE}(?:{_HEADER_LINE})*+"
# A canonical header, as the writer makes it: the `id:` line first and only, every line a
# `key: PLAIN_VALUE` line (group 3 is then the id, and YAML is skipped).
_FAST_HEADER = rf"id: +({PLAIN_VALUE}) *\r?\n(?:(?!id:){KEY}: +(?:{PLAIN_VALUE}) *\r?\n)*+"
# One match per separator followed by a key line (a *candidate opener*). Only the separator line
# is consumed, so the separator closing its header is tried as a candidate too (chains, see
# layout). Groups: 1 the separator; when a header run closes: 2 the header if canonical, 3 its
# id, 4 the header otherwise, 5 the closing separator. Leading with the literal "\n---" (not
# "^---") lets the regex engine skip through bodies fast; the first line of the file has its own
# pattern.
_OPEN_BODY = (
    rf"({SEP_LINE})\n(?={KEY}:(?:[ \t\r\n]|\Z))"
    rf"(?:(?=(?:({_FAST_HEADER})|({_RUN}))({SEP_LINE}))|)"
)
_CANONICAL, _ID, _CLOSER = 2, 3, 5
# Splitting works on the file's bytes (all delimiters are ASCII): offsets are byte offsets for
# the rewrite, and only headers and bodies are decoded, one by one.
_OPEN = re.compile(rf"\n{_OPEN_BODY}".encode(), re.MULTILINE)
_OPEN_AT_TOP = re.compile(_OPEN_BODY.encode(), re.MULTILINE)
_HEADER_RUN = re.compile(_RUN.encode())
_BLANKS = re.compile(rf"(?:{_BLANK_LINE})*+".encode())
# A header line naming one of the contract's fields: what makes a run read as a message header
# when a chain leaves one separator over (see layout).
_FIELD_LINE = re.compile(rb"^(?:id|from|to|thread|type|time):[ \t\r\n]", re.MULTILINE)


class Segment(NamedTuple):
    start: int  # offset of the opening separator
    header_start: int
    header_end: int  # offset of the closing separator
    body_start: int
    end: int  # where the next message or skipped header (or the end of the file) begins
    fast: bool  # the header is canonical: every line a `key: PLAIN_VALUE` line


# A problem found while splitting: (offset, text, offset of a second line or -1, more text);
# the second offset becomes a line number only when warnings are written.
Problem = tuple[int, str, int, str]


class Layout(NamedTuple):
    """The messages of a file (each by the candidate that opens it) and what is wrong in it."""

    heads: list[re.Match[bytes]]  # the candidates (_OPEN matches) that open messages
    ends: list[int]  # where each of those messages ends
    last: int  # start of the last message or skipped header (0 if none)
    problems: list[Problem]
    size: int  # of the file

    def starts(self) -> list[int]:
        """Where each message begins (its opening separator)."""
        return [m.start(1) for m in self.heads]

    def canonical_ids(self) -> list[bytes | None]:
        """Each message's id where its header is canonical (no YAML needed), else None."""
        return [m.group(_ID) for m in self.heads]

    def segment(self, k: int) -> Segment:
        """Message `k`'s parts."""
        m = self.heads[k]
        return Segment(
            m.start(1),
            m.end(),
            m.start(_CLOSER),
            min(m.end(_CLOSER) + 1, self.size),
            self.ends[k],
            m.start(_CANONICAL) >= 0,
        )

    def segments(self) -> list[Segment]:
        return [self.segment(k) for k in range(len(self.heads))]


def _candidates(data: bytes) -> list[re.Match[bytes]]:
    """Every separator followed by a key line, in file order."""
    top = _OPEN_AT_TOP.match(data)
    found = list(_OPEN.finditer(data, top.end() if top else 0))
    if top:
        found.insert(0, top)
    return found


def _unclosed(data: bytes, m: re.Match[bytes]) -> Problem:
    """Why the header opened by candidate `m` has no closing separator."""
    run = _HEADER_RUN.match(data, m.end())
    pos = run.end() if run else m.end()  # the first line that is no header line
    nxt = _BLANKS.match(data, pos).end()  # type: ignore[union-attr]  # may match ""
    start, what = m.start(1), "header is never closed by a '---' line ("
    if nxt == len(data) or data.find(b"\n", pos) < 0:
        return start, what + "the file ends first); skipped", -1, ""
    if nxt > pos and _OPEN_AT_TOP.match(data, nxt):
        return start, what + "line ", nxt, " starts another header); skipped"
    if nxt > pos:
        return start, what + "it has a blank line, line ", pos, "); skipped"
    return start, what + "line ", pos, " is not a 'key: value' header line); skipped"


# What a candidate turns out to be in layout: paired away as a closing separator (or part of
# a body), the opening of a message, or an unclosed header that is skipped.
_TAKEN, _MESSAGE, _SKIPPED = 1, 2, 3


def layout(data: bytes) -> Layout:
    """Which candidates open messages and where each message ends: chains and unclosed headers
    as the boundary rule (module docstring) says."""
    found = _candidates(data)
    size = len(data)
    seps = [m.start(1) for m in found]
    closers = [m.start(_CLOSER) for m in found]
    problems: list[Problem] = []
    if -1 not in closers and set(seps).isdisjoint(closers):
        # What the writer makes: every candidate opens a message and is closed, no chains.
        heads, starts, ends = found, seps, [*seps[1:], size] if seps else []
    else:
        role = _roles(data, found, problems)
        heads, starts, ends = _blocks(found, role, size)
    first = starts[0] if starts else size
    if data[:first].strip():
        problems.append((0, "text outside any message ignored", -1, ""))
    return Layout(heads, ends, starts[-1] if starts else 0, problems, size)


def _roles(data: bytes, found: list[re.Match[bytes]], problems: list[Problem]) -> list[int]:
    """What each candidate is (_TAKEN, _MESSAGE or _SKIPPED), when some are chained (a closing
    separator that opens the next candidate) or never closed; `problems` gets why."""
    seps = [m.start(1) for m in found]
    closers = [m.start(_CLOSER) for m in found]
    where = {sep: k for k, sep in enumerate(seps)}
    role = [0] * len(found)
    for k, closer in enumerate(closers):
        if role[k]:
            continue
        if closer < 0:
            role[k] = _SKIPPED
            problems.append(_unclosed(data, found[k]))
            continue
        chain, nxt = _chain(closers, where, k)
        for j in chain:
            role[j] = _TAKEN
        last = found[chain[-1]]
        if len(chain) % 2 or not _FIELD_LINE.search(data, last.end(), last.start(_CLOSER)):
            paired = chain[0::2]
        else:
            paired = chain[1::2]
            role[k] = _SKIPPED
            problems.append(
                (
                    seps[k],
                    "header is never closed by a '---' line (line ",
                    seps[chain[1]],
                    " starts another header); skipped",
                )
            )
        for j in paired:
            role[j] = _MESSAGE
        if nxt is not None and paired[-1] != chain[-1]:  # a key line after a body rule
            role[nxt] = _SKIPPED
            problems.append(_unclosed(data, found[nxt]))
        elif nxt is not None:  # the last closing separator, followed by key-line text
            role[nxt] = _TAKEN
    return role


def _chain(closers: list[int], where: dict[int, int], k: int) -> tuple[list[int], int | None]:
    """Candidate `k` and those its closing separators open in turn, each closed itself; and the
    candidate the last closer opens that is never closed (None: there is none)."""
    chain = [k]
    nxt = where.get(closers[k])
    while nxt is not None and closers[nxt] >= 0:
        chain.append(nxt)
        nxt = where.get(closers[nxt])
    return chain, nxt


def _blocks(
    found: list[re.Match[bytes]], role: list[int], size: int
) -> tuple[list[re.Match[bytes]], list[int], list[int]]:
    """Messages and skipped headers are blocks; each runs to the next one (or the end). The
    messages' candidates, every block's start and each message's end."""
    heads: list[re.Match[bytes]] = []
    starts: list[int] = []
    after: list[int] = []  # index in `starts` of the block after each message
    for m, r in zip(found, role, strict=True):
        if r == _MESSAGE:
            heads.append(m)
            after.append(len(starts) + 1)
        if r >= _MESSAGE:
            starts.append(m.start(1))
    bounds = [*starts, size]
    return heads, starts, [bounds[i] for i in after]


# ---------------------------------------------------------------- for the store


def window_cut(data: bytes, truncated: bool) -> int:
    """Where the listed part of a window ends: a window cut by the read limit loses its last
    message, which may be incomplete."""
    if not truncated:
        return len(data)
    return layout(data).last


def blank_line_after(tail: bytes) -> bytes:
    """What to write after a file ending in `tail` (its last 3 bytes) so that it ends with a
    blank line: then no header left unclosed before can run into an appended message (see the
    boundary rule). The writer's files need nothing. A hand-written last body reads the same:
    it now ends with a line end and a blank line in its own style, which reading removes."""
    tail = (b"\n\n\n" + tail)[-3:]  # the start of the file counts as the start of a line
    if tail.endswith((b"\n\n", b"\n\r\n")):
        return b""
    if tail.endswith(b"\r\n"):
        return b"\r\n"
    return b"\n" if tail.endswith(b"\n") else b"\n\n"
