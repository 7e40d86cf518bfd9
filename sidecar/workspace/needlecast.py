"""The needlecast message format (`.needlecast/inbox.md`, `outbox.md`): text <-> messages.

Pure: text in, messages plus warnings out, never an exception for a bad file; no file I/O. The
files themselves (lock, journalled appends, atomic rewrites) are `sidecar.workspace.mailbox`'s job.

The boundary rule (where each message begins and ends, how bodies are escaped, the blank line
an append writes first) is written down and applied in `sidecar.workspace.needlecast_bounds`;
this module reads and writes the headers and bodies, escaping body lines as the rule says.

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
from typing import cast

import yaml
from frontmatter.default_handlers import YAMLHandler

from sidecar.core.contract import MESSAGE_TYPES
from sidecar.workspace.needlecast_bounds import KEY, PLAIN_VALUE, SEP_LINE, Problem, Segment, layout

_TYPES = frozenset(MESSAGE_TYPES)  # checked once per message: a set
#: At most this many warnings are reported for one file (a garbage file would flood otherwise).
MAX_WARNINGS = 100

# Escaping adds or drops one backslash at the start of a line that is backslashes + separator
# (lookahead + a plain replacement keeps re.sub in C).
_ESCAPABLE = re.compile(rf"^(?=\\*{SEP_LINE})", re.MULTILINE)
_ESCAPED = re.compile(rf"^\\(?=\\*{SEP_LINE})", re.MULTILINE)
# A canonical header line (the writer's form): YAML would read its value as written.
_FAST_LINE = re.compile(rf"^({KEY}): +({PLAIN_VALUE}) *\r?$", re.MULTILINE)
_PLAIN = re.compile(rf"(?:{PLAIN_VALUE})\Z")
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


def _strip_body(raw: str) -> str:
    if raw.endswith("\n\n"):
        return raw[:-2]
    for ending in ("\r\n\r\n", "\r\n", "\n"):
        if raw.endswith(ending):
            return raw[: -len(ending)]
    return raw


def _load_header(header: str, fast: bool) -> tuple[dict[object, object] | None, str, int]:
    """Header text -> (mapping or None, problem, offset of the problem within the header).
    `fast`: the boundary scan found every line to be a _FAST_LINE."""
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
    seg: Segment, decode: _Decoder
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
    lay = layout(data)
    if not lay.heads:
        return []
    starts, raw_ids = lay.starts(), lay.canonical_ids()
    if None not in raw_ids and _YAML_WORDS_BYTES.isdisjoint(raw_ids):
        canonical = cast("list[bytes]", raw_ids)  # no None among them
        ids = b"\n".join(canonical).decode().split("\n")  # ASCII words, never a "\n"
        return list(zip(starts, lay.ends, ids, strict=True))
    entries: Entries = []
    decode = _Decoder(data)
    for k, (start, end, raw) in enumerate(zip(starts, lay.ends, raw_ids, strict=True)):
        if raw is not None and raw not in _YAML_WORDS_BYTES:
            entries.append((start, end, raw.decode()))
            continue
        fields, ident, _, _ = _read_header(lay.segment(k), decode)
        if fields is not None:
            entries.append((start, end, ident))
    return entries


def parse_bytes(data: bytes) -> tuple[ParseResult, Entries]:
    """parse_messages plus the entries."""
    lay = layout(data)
    problems: list[tuple[int, str]] = []
    refs = list(lay.problems)  # problems that name a second line
    messages: list[Message] = []
    entries: Entries = []
    first_seen: dict[str, int] = {}
    decode = _Decoder(data)
    for seg in lay.segments():
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
    data: bytes, problems: list[tuple[int, str]], refs: list[Problem]
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
