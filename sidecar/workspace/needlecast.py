"""The needlecast message format (`.needlecast/inbox.md`, `outbox.md`): text <-> messages.

Pure: text in, messages plus warnings out, never an exception for a bad file; no file I/O. The
files themselves (lock, journalled appends, atomic rewrites) are `sidecar.workspace.mailbox`'s job.

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

Header values are single-line strings (``to`` and ``thread`` may be absent); scalars are kept as
written (no YAML 1.1 bools, numbers or dates). A header with no ``id`` gets a stable derived id
``noid-<12 hex>`` (reported as a warning) so it can still be acked. Each broken message is a
warning "line N: ..."; the messages around it are still read.

python-frontmatter's YAMLHandler loads each header (with _HeaderLoader). Its split/dump are not
used: they handle one document per file, strip the body and strip() dumped values, so bodies
like "\n\n" or a value of U+00A0 would not round-trip. Headers in our own canonical form skip
YAML altogether (_FAST_LINE), which is what parses 10,000 messages in well under 0.3 s.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import re
import secrets
from collections.abc import Iterable
from typing import NamedTuple

import yaml
from frontmatter.default_handlers import YAMLHandler

from sidecar.core.contract import MESSAGE_TYPES

_TYPES = frozenset(MESSAGE_TYPES)  # checked once per message: a set
#: At most this many warnings are reported for one file (a garbage file would flood otherwise).
MAX_WARNINGS = 100

_SEP_LINE = r"---[ \t]*\r?$"  # a separator line, without its line end
_KEY = r"[A-Za-z_][A-Za-z0-9_-]*"
# Escaping adds or drops one backslash at the start of a line that is backslashes + separator
# (lookahead + a plain replacement keeps re.sub in C).
_ESCAPABLE = re.compile(r"^(?=\\*---[ \t]*\r?$)", re.MULTILINE)
_ESCAPED = re.compile(r"^\\(?=\\*---[ \t]*\r?$)", re.MULTILINE)
# Values YAML reads back as the very same string: a word starting with a letter (minus YAML 1.1's
# bool/null words) or a timestamp (_HeaderLoader keeps those as the text written). Lines like this
# skip the YAML parser, which is what makes 10k messages fast.
_PLAIN_VALUE = r"[A-Za-z][A-Za-z0-9_-]*|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"
_FAST_LINE = re.compile(rf"^([A-Za-z_][A-Za-z0-9_-]*): +({_PLAIN_VALUE}) *\r?$", re.MULTILINE)
_PLAIN = re.compile(rf"(?:{_PLAIN_VALUE})\Z")
# Header lines (see the boundary rule): a `key:` line, an indented line, a `#` comment or a
# `- item` line. A separator or a blank line is none of these.
_KEY_LINE = rf"{_KEY}:(?:[ \t\r][^\n]*)?\n"
_HEADER_LINE = (
    rf"(?:{_KEY}:(?:[ \t\r][^\n]*)?|[ \t]+[^ \t\r\n][^\n]*|#[^\n]*|-(?:[ \t\r][^\n]*)?)\n"
)
_BLANK_LINE = r"[ \t]*\r?\n"
# A header: a key line, then header lines. Possessive: linear, no backtracking; a run that
# stops anywhere but at a separator is not closed.
_RUN = rf"{_KEY_LINE}(?:{_HEADER_LINE})*+"
# A canonical header, as the writer makes it: the `id:` line first and only, every line a
# _FAST_LINE (group 3 is then the id, and YAML is skipped).
_FAST_HEADER = rf"id: +({_PLAIN_VALUE}) *\r?\n(?:(?!id:){_KEY}: +(?:{_PLAIN_VALUE}) *\r?\n)*+"
# One match per separator followed by a key line (a *candidate opener*). Only the separator line
# is consumed, so the separator closing its header is tried as a candidate too (chains, see
# _layout). Groups: 1 the separator; when a header run closes: 2 the header if canonical, 3 its
# id, 4 the header otherwise, 5 the closing separator. Leading with the literal "\n---" (not
# "^---") lets the regex engine skip through bodies fast; the first line of the file has its own
# pattern.
_OPEN_BODY = (
    rf"({_SEP_LINE})\n(?={_KEY}:(?:[ \t\r\n]|\Z))"
    rf"(?:(?=(?:({_FAST_HEADER})|({_RUN}))({_SEP_LINE}))|)"
)
_CLOSER = 5
# Splitting works on the file's bytes (all delimiters are ASCII): offsets are byte offsets for
# the rewrite, and only headers and bodies are decoded, one by one.
_OPEN = re.compile(rf"\n{_OPEN_BODY}".encode(), re.MULTILINE)
_OPEN_AT_TOP = re.compile(_OPEN_BODY.encode(), re.MULTILINE)
_HEADER_RUN = re.compile(_RUN.encode())
_BLANKS = re.compile(rf"(?:{_BLANK_LINE})*+".encode())
# A header line naming one of the contract's fields: what makes a run read as a message header
# when a chain leaves one separator over (see _layout).
_FIELD_LINE = re.compile(rb"^(?:id|from|to|thread|type|time):[ \t\r\n]", re.MULTILINE)
_YAML_WORDS = frozenset(
    form
    for word in ("yes", "no", "true", "false", "on", "off", "null")
    for form in (word, word.capitalize(), word.upper())
)
_YAML_WORDS_BYTES = frozenset(word.encode() for word in _YAML_WORDS)
# Characters YAML or our line splitting treat as line breaks, and other controls: never in a header.
_BAD_HEADER_CHARS = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029\ufeff\ud800-\udfff]")
_YAML = YAMLHandler()  # python-frontmatter's YAML front matter loader
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _HeaderLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe YAML, but every header field is text: a scalar that YAML 1.1 would make a bool,
    number or date stays the text that was written (`id: 0x1F` is "0x1F", `time` is passed on
    as written, and an impossible date such as 2026-02-31 is no reason to drop a message)."""


def _scalar_as_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> str:
    return str(loader.construct_scalar(node))


for _tag in ("bool", "int", "float", "timestamp"):
    _HeaderLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _scalar_as_text)


@dataclasses.dataclass(frozen=True)
class Message:
    id: str
    sender: str | None  # the `from` field
    type: str | None
    time: str | None
    body: str = ""
    to: str | None = None
    thread: str | None = None


@dataclasses.dataclass(frozen=True)
class ParseResult:
    messages: tuple[Message, ...]
    warnings: tuple[str, ...]
    truncated: bool = False


def new_message_id() -> str:
    return f"msg-{secrets.token_hex(6)}"


# ---------------------------------------------------------------- rendering (pure)


def has_bad_header_chars(value: str) -> bool:
    """True if `value` cannot be a header value (line breaks, controls, lone surrogates)."""
    return _BAD_HEADER_CHARS.search(value) is not None


def _render_field(key: str, value: str) -> str:
    if has_bad_header_chars(value):
        msg = f"header field {key!r} must be one line of printable text"
        raise ValueError(msg)
    if _PLAIN.match(value) and value not in _YAML_WORDS:
        return f"{key}: {value}\n"
    # yaml.dump, not frontmatter's exporter: that one strip()s its output, which eats a value
    # of unicode spaces (U+00A0 becomes an empty field).
    line = yaml.dump({key: value}, Dumper=_DUMPER, allow_unicode=True, width=1_000_000)
    if line.count("\n") != 1:
        msg = f"header field {key!r} does not fit on one line"
        raise ValueError(msg)
    return line


def render_message(message: Message) -> str:
    """One message as file text; raises ValueError for a header value that cannot be one line."""
    if not message.id:
        msg = "a message needs an id"
        raise ValueError(msg)
    parts = ["---\n", _render_field("id", message.id)]
    for key, value in (
        ("from", message.sender),
        ("to", message.to),
        ("thread", message.thread),
        ("type", message.type),
        ("time", message.time),
    ):
        if value is not None:
            parts.append(_render_field(key, value))
    parts.append("---\n")
    parts.append(_ESCAPABLE.sub(r"\\", message.body))
    parts.append("\n\n")
    return "".join(parts)


def render_messages(messages: Iterable[Message]) -> str:
    return "".join(render_message(m) for m in messages)


# ---------------------------------------------------------------- parsing (pure)


class _Segment(NamedTuple):
    start: int  # offset of the opening separator
    header_start: int
    header_end: int  # offset of the closing separator
    body_start: int
    end: int  # where the next message or skipped header (or the end of the file) begins
    fast: bool  # every header line is a _FAST_LINE


# A problem found while splitting: (offset, text, offset of a second line or -1, more text);
# the second offset becomes a line number only when warnings are written.
_Problem = tuple[int, str, int, str]


class _Layout(NamedTuple):
    heads: list[re.Match[bytes]]  # the candidates (_OPEN matches) that open messages
    ends: list[int]  # where each of those messages ends
    last: int  # start of the last message or skipped header (0 if none)
    problems: list[_Problem]


class _Scan(NamedTuple):
    segments: list[_Segment]
    last: int  # start of the last message or skipped header (0 if none)
    problems: list[_Problem]


def _candidates(data: bytes) -> list[re.Match[bytes]]:
    """Every separator followed by a key line, in file order."""
    top = _OPEN_AT_TOP.match(data)
    found = list(_OPEN.finditer(data, top.end() if top else 0))
    if top:
        found.insert(0, top)
    return found


def _unclosed(data: bytes, m: re.Match[bytes]) -> _Problem:
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


# What a candidate turns out to be in _layout: paired away as a closing separator (or part of
# a body), the opening of a message, or an unclosed header that is skipped.
_TAKEN, _MESSAGE, _SKIPPED = 1, 2, 3


def _layout(data: bytes) -> _Layout:
    """Which candidates open messages and where each message ends: chains and unclosed headers
    as the boundary rule (module docstring) says."""
    found = _candidates(data)
    size = len(data)
    seps = [m.start(1) for m in found]
    closers = [m.start(_CLOSER) for m in found]
    problems: list[_Problem] = []
    if -1 not in closers and set(seps).isdisjoint(closers):
        # What the writer makes: every candidate opens a message and is closed, no chains.
        heads, starts, ends = found, seps, [*seps[1:], size] if seps else []
    else:
        role = _roles(data, found, problems)
        heads, starts, ends = _blocks(found, role, size)
    first = starts[0] if starts else size
    if data[:first].strip():
        problems.append((0, "text outside any message ignored", -1, ""))
    return _Layout(heads, ends, starts[-1] if starts else 0, problems)


def _roles(data: bytes, found: list[re.Match[bytes]], problems: list[_Problem]) -> list[int]:
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


def _scan(data: bytes) -> _Scan:
    """Split a file into message segments by the boundary rule (see the module docstring)."""
    lay = _layout(data)
    size = len(data)
    segments = [
        _Segment(
            m.start(1),
            m.end(),
            m.start(_CLOSER),
            min(m.end(_CLOSER) + 1, size),
            end,
            m.start(2) >= 0,
        )
        for m, end in zip(lay.heads, lay.ends, strict=True)
    ]
    return _Scan(segments, lay.last, lay.problems)


def _strip_body(raw: str) -> str:
    if raw.endswith("\n\n"):
        return raw[:-2]
    for ending in ("\r\n\r\n", "\r\n", "\n"):
        if raw.endswith(ending):
            return raw[: -len(ending)]
    return raw


def _load_header(header: str, fast: bool) -> tuple[dict[object, object] | None, str, int]:
    """Header text -> (mapping or None, problem, offset of the problem within the header).
    `fast`: _scan found every line to be a _FAST_LINE."""
    if fast:
        pairs: dict[object, object] = dict(_FAST_LINE.findall(header))
        if _YAML_WORDS.isdisjoint(pairs.values()):
            return pairs, "", 0
    try:
        loaded = _YAML.load(header, Loader=_HeaderLoader)
    except Exception as exc:
        # Broad on purpose: PyYAML's constructors raise more than YAMLError (ValueError,
        # OverflowError, RecursionError ...), and a bad user file must never raise.
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        return None, f"malformed YAML header ({problem})", getattr(mark, "index", 0) or 0
    if not isinstance(loaded, dict):
        return None, "header is not a YAML mapping", 0
    return loaded, "", 0


def _field(data: dict[object, object], key: str) -> tuple[str | None, str]:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value, ""
    if isinstance(value, bool | int | float):
        return str(value), ""
    return None, f"field {key!r} is not a single value; ignored"


def _derived_id(header: str, body: str) -> str:
    digest = hashlib.sha256(f"{header}\0{body}".encode("utf-8", "surrogatepass"))
    return f"noid-{digest.hexdigest()[:12]}"


def parse_messages(text: str) -> ParseResult:
    """Messages and warnings ("line N: ...") from a message file's text. Never raises."""
    result, _ = parse_bytes(text.encode("utf-8", "surrogatepass"))
    return result


# (start, end, id) of each readable message, in bytes: what a removal needs to know.
Entries = list[tuple[int, int, str]]


class _Decoder:
    """Decodes pieces of a file; bytes that are not UTF-8 become U+FFFD and the first one is
    remembered for a warning (the file itself is only ever spliced as bytes, never re-encoded)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.bad = -1

    def __call__(self, start: int, end: int) -> str:
        piece = self.data[start:end]
        try:
            return piece.decode()
        except UnicodeDecodeError as exc:
            if self.bad < 0:
                self.bad = start + exc.start
            return piece.decode(errors="replace")


def _read_header(
    seg: _Segment, decode: _Decoder
) -> tuple[dict[object, object] | None, str, str, int]:
    """(fields or None, id, problem, byte offset of the problem in the header) of a segment;
    a missing id is derived from the message's text."""
    header = decode(seg.header_start, seg.header_end)
    fields, problem, where = _load_header(header, seg.fast)
    if fields is None:
        return None, "", problem, len(header[:where].encode())  # YAML counts characters
    ident, problem = _field(fields, "id")
    if not ident:
        ident = _derived_id(header, _strip_body(decode(seg.body_start, seg.end)))
        problem = f"message has no id; it is given the id {ident}"
    return fields, ident, problem, 0


def message_ids(data: bytes) -> Entries:
    """The entries parse_bytes gives, without building messages (what a removal needs).
    Canonical headers give their id straight from the regex: list operations, no loop."""
    lay = _layout(data)
    heads = lay.heads
    if not heads:
        return []
    starts = [m.start(1) for m in heads]
    raw_ids = [m.group(3) for m in heads]
    if None not in raw_ids and _YAML_WORDS_BYTES.isdisjoint(raw_ids):
        ids = b"\n".join(raw_ids).decode().split("\n")  # ASCII words, never a "\n"
        return list(zip(starts, lay.ends, ids, strict=True))
    entries: Entries = []
    decode = _Decoder(data)
    size = len(data)
    for m, start, end, raw in zip(heads, starts, lay.ends, raw_ids, strict=True):
        if raw is not None and raw not in _YAML_WORDS_BYTES:
            entries.append((start, end, raw.decode()))
            continue
        seg = _Segment(
            start, m.end(), m.start(_CLOSER), min(m.end(_CLOSER) + 1, size), end, m.start(2) >= 0
        )
        fields, ident, _, _ = _read_header(seg, decode)
        if fields is not None:
            entries.append((start, end, ident))
    return entries


def parse_bytes(data: bytes) -> tuple[ParseResult, Entries]:
    """parse_messages plus the entries."""
    scan = _scan(data)
    problems: list[tuple[int, str]] = []
    refs = list(scan.problems)  # problems that name a second line
    messages: list[Message] = []
    entries: Entries = []
    first_seen: dict[str, int] = {}
    decode = _Decoder(data)
    for seg in scan.segments:
        fields, ident, problem, where = _read_header(seg, decode)
        if fields is None:
            problems.append((seg.header_start + where, f"message skipped: {problem}"))
            continue
        entries.append((seg.start, seg.end, ident))
        if problem:
            problems.append((seg.start, problem))
        values: dict[str, str | None] = {}
        for key in ("from", "to", "thread", "type", "time"):
            values[key], problem = _field(fields, key)
            if problem:
                problems.append((seg.start, f"message {ident}: {problem}"))
        for key in ("from", "type", "time"):
            if values[key] is None:
                problems.append((seg.start, f"message {ident}: no {key!r}"))
        if values["type"] is not None and values["type"] not in _TYPES:
            problems.append((seg.start, f"message {ident}: unknown type {values['type']!r}"))
        if ident in first_seen:
            refs.append(
                (seg.start, f"duplicate id {ident} (first at line ", first_seen[ident], ")")
            )
        else:
            first_seen[ident] = seg.start
        body = _strip_body(decode(seg.body_start, seg.end))
        if "\\---" in body:
            body = _ESCAPED.sub("", body)
        messages.append(
            Message(
                id=ident,
                sender=values["from"],
                type=values["type"],
                time=values["time"],
                body=body,
                to=values["to"],
                thread=values["thread"],
            )
        )
    if decode.bad >= 0:
        problems.append((decode.bad, "not UTF-8; bad bytes shown as U+FFFD"))
    return ParseResult(tuple(messages), _number_warnings(data, problems, refs)), entries


def _number_warnings(
    data: bytes, problems: list[tuple[int, str]], refs: list[_Problem]
) -> tuple[str, ...]:
    """Offsets -> "line N: ..." (line numbers are only computed when something is wrong)."""
    if not problems and not refs:
        return ()
    newlines = [m.start() for m in re.finditer(b"\n", data)]

    def line(pos: int) -> int:
        return bisect.bisect_left(newlines, pos) + 1

    for pos, text, other, more in refs:
        problems.append((pos, f"{text}{line(other)}{more}" if other >= 0 else text))
    problems.sort(key=lambda p: p[0])
    out = [f"line {line(pos)}: {problem}" for pos, problem in problems[:MAX_WARNINGS]]
    if len(problems) > MAX_WARNINGS:
        out.append(f"... and {len(problems) - MAX_WARNINGS} more warnings")
    return tuple(out)


# ---------------------------------------------------------------- for the store (pure)


def window_cut(data: bytes, truncated: bool) -> int:
    """Where the listed part of a window ends: a window cut by the read limit loses its last
    message, which may be incomplete."""
    if not truncated:
        return len(data)
    return _scan(data).last


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
