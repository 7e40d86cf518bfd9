"""`.cstack/CURRENT.md` as text: a forgiving parser (text -> CurrentState, never raises) and the
section edits the writers make, on one section scanner so both agree on the file's structure.

Pure, no file I/O: reading and writing the file is `sidecar.workspace.cstack_files`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import cast

from sidecar.core.contract import STATUS_VALUES, Status

__all__ = [
    "WRITABLE_STATUSES",
    "CurrentState",
    "check_writable",
    "edit_sections",
    "goal_lines",
    "parse_current",
]

# What a writer may set; `unknown` is only ever a reading.
WRITABLE_STATUSES = frozenset(STATUS_VALUES) - {"unknown"}


@dataclass(frozen=True)
class CurrentState:
    status: Status
    task: str | None
    progress_total: int
    progress_completed: int
    blockers: tuple[str, ...]
    next_steps: tuple[str, ...]
    warnings: tuple[str, ...]


# ---------------------------------------------------------------------------------------------
# Line and section scanning (shared by the parser and the writers, so they agree on structure)

# A level-2 ATX heading: up to three spaces, exactly `##`, then whitespace or end of line.
# `(.*)` is greedy with no trailing pattern, so a long line is matched in linear time.
_HEADING = re.compile(r" {0,3}##(?:[ \t]+(.*))?")
# Task lines the writer escapes with a leading backslash. It is "a heading, after any number of
# leading backslashes", so the set is closed under adding a backslash: unescaping exactly the
# lines that start with `\` and are in the set is the inverse of escaping (see _escape_task).
_NEEDS_ESCAPE = re.compile(r"\\* {0,3}##(?:[ \t]|$)")
_CHECKBOX = re.compile(r"\s*(?:[-*+]|\d{1,9}[.)])[ \t]+\[([ xX])\]")
_LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+(.*))?")
_RULE = re.compile(r"\s*([-*_=])(?:\s*\1){2,}\s*")
_BOX = re.compile(r"\[([ xX])\][ \t]*")
_WORD = re.compile(r"[a-z]+")
_NONE_MARKERS = frozenset({"none", "n/a", "na", "nothing", "no blockers", "-"})
_MAX_DUP_WARNINGS = 5  # a file of thousands of headings must not make /status huge
_TITLES = {"status": "Status", "task": "Task"}
# Only unambiguous spellings: a looser alias (`## Goal`) would turn a file that has both
# sections into a confusing "duplicate" warning.
_ALIASES = {
    "current task": "task",
    "current status": "status",
    "blocker": "blockers",
    "next step": "next steps",
}


def _split_keepends(text: str) -> list[str]:
    """Split on `\\n` only (not str.splitlines' dozen separators), keeping each line's ending."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    if lines[-1]:
        out.append(lines[-1])
    return out


def _content(line: str) -> str:
    """A line without its ending; every trailing CR goes too, so CRLF and LF files read alike."""
    return line.rstrip("\n").rstrip("\r")


def _section_key(title: str) -> str:
    name = title.strip()
    # Optional closing hashes (`## Task ##`). Not a regex: `[ \t]+#+$` is quadratic on a long
    # run of spaces, and this runs on every heading of an untrusted file.
    bare = name.rstrip("#")
    if bare != name and (not bare or bare[-1] in " \t"):
        name = bare
    name = name.strip().strip("*_`").strip().rstrip(":").strip()
    name = " ".join(name.lower().split())
    return _ALIASES.get(name, name)


@dataclass(frozen=True)
class _Section:
    key: str
    title: str
    head: int  # index of the heading line
    start: int  # body is lines[start:end]
    end: int


def _scan(contents: list[str]) -> list[_Section]:
    heads: list[tuple[int, str]] = []
    for i, line in enumerate(contents):
        m = _HEADING.fullmatch(line)
        if m:
            heads.append((i, (m.group(1) or "").strip()))
    sections = []
    for n, (i, title) in enumerate(heads):
        end = heads[n + 1][0] if n + 1 < len(heads) else len(contents)
        sections.append(_Section(_section_key(title), title, i, i + 1, end))
    return sections


def _first_sections(sections: list[_Section], warnings: list[str] | None) -> dict[str, _Section]:
    """The first section of each name wins (that is the one a reader's eye finds first too)."""
    first: dict[str, _Section] = {}
    dups = 0
    for sec in sections:
        if sec.key not in first:
            first[sec.key] = sec
            continue
        dups += 1
        if warnings is not None and dups <= _MAX_DUP_WARNINGS:
            warnings.append(
                f"duplicate '## {_short(sec.title)}' section at line {sec.head + 1} ignored"
                f" (the one at line {first[sec.key].head + 1} is used)"
            )
    if warnings is not None and dups > _MAX_DUP_WARNINGS:
        warnings.append(f"{dups - _MAX_DUP_WARNINGS} more duplicate sections ignored")
    return first


def _strip_bom(text: str) -> tuple[str, str]:
    if text.startswith("\ufeff"):
        return "\ufeff", text[1:]
    return "", text


# ---------------------------------------------------------------------------------------------
# Parsing


def _short(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _visible(body: list[str]) -> list[str]:
    """Non-blank lines outside HTML comments (templates often explain a section in one)."""
    out: list[str] = []
    in_comment = False
    for line in body:
        kept: list[str] = []  # pieces outside comments; one pass over the line, no rebuilding
        pos = 0
        while pos <= len(line):
            if in_comment:
                end = line.find("-->", pos)
                if end < 0:
                    break
                in_comment, pos = False, end + 3
            else:
                start = line.find("<!--", pos)
                kept.append(line[pos:] if start < 0 else line[pos:start])
                if start < 0:
                    break
                in_comment, pos = True, start + 4
        rest = "".join(kept)
        if rest.strip():
            out.append(rest)
    return out


def _parse_status(body: list[str], warnings: list[str]) -> Status:
    raw = next((line.strip() for line in _visible(body)), "")
    if not raw:
        warnings.append("'## Status' section is empty")
        return "unknown"
    m = _LIST_ITEM.fullmatch(raw)
    value = (m.group(1) or "") if m else raw
    # `**working**`, `_done_`, `` `idle` ``, `Working.` and `blocked (waiting on X)` all count.
    cleaned = value.strip().strip("*_`").strip().lower()
    word = _WORD.match(cleaned)
    if word and word.group() in STATUS_VALUES:
        rest = cleaned[word.end() :]
        if not rest or not (rest[0].isalnum() or rest[0] == "_"):
            return cast(Status, word.group())  # one of STATUS_VALUES, checked above
    warnings.append(f"unrecognised status {_short(raw)!r} (expected one of {_known()})")
    return "unknown"


def _known() -> str:
    return ", ".join(sorted(WRITABLE_STATUSES))


def _parse_items(body: list[str], *, drop_checked: bool = False) -> tuple[str, ...]:
    """List items (`-`, `*`, `+`, `1.`), or plain lines; indented plain lines continue an item.

    A checkbox is taken off the item; with drop_checked a ticked item (a resolved blocker) is
    left out.
    """
    parts: list[list[str]] = []  # each item's lines, joined once at the end (linear time)
    for line in _visible(body):
        if _RULE.fullmatch(line):
            continue
        m = _LIST_ITEM.fullmatch(line)
        if m:
            parts.append([(m.group(1) or "").strip()])
        elif parts and line[:1] in (" ", "\t"):
            parts[-1].append(line.strip())
        else:
            parts.append([line.strip()])
    out = []
    for raw in (" ".join(p for p in item if p) for item in parts):
        box = _BOX.match(raw)
        if box and drop_checked and box.group(1) != " ":
            continue
        item = raw[box.end() :] if box else raw
        if item and item.strip("()*_`. ").lower() not in _NONE_MARKERS:
            out.append(item)
    return tuple(out)


def _unescape_task(line: str) -> str:
    if line.startswith("\\") and _NEEDS_ESCAPE.match(line):
        return line[1:]
    return line


def _escape_task(line: str) -> str:
    """Prefix a backslash to a line that would read as a heading (or as an escaped one).

    `## Foo` in a goal is stored as `\\## Foo`, `\\## Foo` as `\\\\## Foo`, and so on; the parser
    removes exactly one backslash from such lines, so the task text round-trips unchanged and can
    never open a new section. Markdown renders `\\#` as a literal `#`, so the file still reads well.
    """
    return "\\" + line if _NEEDS_ESCAPE.match(line) else line


def parse_current(text: str) -> CurrentState:
    """Parse CURRENT.md text. Pure and total: bad input gives `unknown` fields plus warnings."""
    warnings: list[str] = []
    _, text = _strip_bom(text)
    contents = [_content(line) for line in _split_keepends(text)]
    if not any(line.strip() for line in contents):
        warnings.append("CURRENT.md is empty")
    sections = _first_sections(_scan(contents), warnings)

    def body(key: str) -> list[str] | None:
        sec = sections.get(key)
        return None if sec is None else contents[sec.start : sec.end]

    status_body = body("status")
    status: Status = "unknown"
    if status_body is None:
        if warnings[:1] != ["CURRENT.md is empty"]:
            warnings.append("no '## Status' section")
    else:
        status = _parse_status(status_body, warnings)

    task_body = body("task")
    task = None
    if task_body is not None:
        task = "\n".join(_unescape_task(line) for line in task_body).strip() or None

    total = completed = 0
    for line in _visible(body("progress") or []):
        m = _CHECKBOX.match(line)
        if m:
            total += 1
            completed += m.group(1) != " "

    return CurrentState(
        status=status,
        task=task,
        progress_total=total,
        progress_completed=completed,
        blockers=_parse_items(body("blockers") or [], drop_checked=True),
        next_steps=_parse_items(body("next steps") or []),
        warnings=tuple(warnings),
    )


# ---------------------------------------------------------------------------------------------
# Edits the writers make


def goal_lines(goal: str) -> list[str]:
    """The goal as stored: LF newlines, outer whitespace stripped, heading-like lines escaped."""
    if "\x00" in goal:
        msg = "goal contains a NUL character"
        raise ValueError(msg)
    # Lone surrogates (undecodable bytes smuggled in through os.environ) cannot be UTF-8 encoded.
    goal = re.sub("[\ud800-\udfff]", "\ufffd", goal)
    text = "\n".join(line.rstrip("\r") for line in goal.split("\n")).strip()
    return [_escape_task(line) for line in text.split("\n")] if text else []


def _refill(chunk: list[str], new: list[str], eol: str) -> list[str]:
    """A section (heading line + body, with endings) whose content lines are replaced by `new`.

    Blank lines around the content are kept, so the spacing between sections does not change.
    """
    head, body = chunk[0], chunk[1:]
    filled = [i for i, line in enumerate(body) if _content(line).strip()]
    new_lines = [line + eol for line in new]
    if filled:
        first, last = filled[0], filled[-1]
        if new_lines and not body[last].endswith("\n"):  # keep "no newline at end of file"
            new_lines[-1] = new[-1]
        return [head, *body[:first], *new_lines, *body[last + 1 :]]
    if not new:
        return chunk
    if not head.endswith("\n"):  # the heading was the file's last line
        head += eol
    return [head, *new_lines, *body]


def _insert(lines: list[str], at: int, block: list[str], eol: str) -> None:
    """Insert whole sections (lines without endings, ending in a blank line) before line `at`."""
    new = [line + eol for line in block]
    if at == len(lines):
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += eol
        if lines and _content(lines[-1]).strip():
            new.insert(0, eol)
        new.pop()  # no blank line at the very end of the file
    elif at > 0 and _content(lines[at - 1]).strip():
        new.insert(0, eol)
    lines[at:at] = new


def edit_sections(text: str, replace: dict[str, list[str]]) -> str:
    """Replace the contents of the given sections (by key), adding missing ones; keep the rest."""
    bom, text = _strip_bom(text)
    lines = _split_keepends(text)
    eol = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"

    # Existing sections first, bottom-up so the earlier indices stay valid.
    sections = _first_sections(_scan([_content(line) for line in lines]), None)
    for sec in sorted(sections.values(), key=lambda sec: sec.head, reverse=True):
        if sec.key in replace:
            lines[sec.head : sec.end] = _refill(lines[sec.head : sec.end], replace[sec.key], eol)

    missing = [key for key in replace if key not in sections]
    if missing:
        sections = _first_sections(_scan([_content(line) for line in lines]), None)
        block: list[str] = []
        for key in missing:
            block += [f"## {_TITLES.get(key, key.title())}", *replace[key], ""]
        # A missing Task goes right after Status; anything else before the first section.
        if missing == ["task"] and "status" in sections:
            at = sections["status"].end
        elif sections:
            at = min(sec.head for sec in sections.values())
        else:
            at = len(lines)
        _insert(lines, at, block, eol)
    return bom + "".join(lines)


def check_writable(status: str) -> None:
    """Raise ValueError unless a writer may set `status`."""
    if status not in WRITABLE_STATUSES:
        msg = f"cannot write status {status!r}; expected one of {_known()}"
        raise ValueError(msg)
