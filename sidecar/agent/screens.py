"""What a CLI's screen says about its agent, as a person looking at it would read it: its input
prompt (it takes a typed prompt), a permission prompt, some other dialog that needs a person, or
work in progress. The vocabulary and the generic reading live here; each CLI's own knowledge of
its screen lives in its package (`sidecar.agent.clis.<name>.screen`), all pure.

The rule every recognizer follows: a screen that is neither the input prompt nor work in
progress is a dialog, so a shape never seen before reads as `waiting`, never as `idle`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from sidecar.agent.screen_choices import DIGITS, MAX_CHOICES, Choice, menu, yes_no
from sidecar.core.text import MAX_REASON, one_line


class Screen(Protocol):
    """What a recognizer reads of a screen: its lines and the cursor (`sidecar.pane.screen`'s
    snapshot is one; a recognizer needs nothing of tmux, so a CLI's package imports no pane)."""

    @property
    def lines(self) -> Sequence[str]: ...

    @property
    def cols(self) -> int: ...

    @property
    def cursor_row(self) -> int: ...

    @property
    def cursor_col(self) -> int: ...


class Seen(Enum):
    PROMPT = "prompt"  # the input prompt: a typed prompt is taken
    PERMISSION = "permission"  # the CLI asks whether it may run a tool
    DIALOG = "dialog"  # any other screen that needs a person (first start, trust, picker...)
    WORKING = "working"  # work in progress on screen (a spinner, "esc to interrupt")


@dataclass(frozen=True)
class Reading:
    seen: Seen
    reason: str | None = None  # PERMISSION / DIALOG: the question or title line, one line
    # The recognizer saw the whole of a shape it knows (a dialog with its footer, the prompt
    # with its hint line): safe to act on before the pane settles, with no half-drawn frame.
    complete: bool = False
    choices: tuple[Choice, ...] = ()  # PERMISSION / DIALOG: the answers it offers, if read

    @property
    def needs_person(self) -> bool:
        return self.seen in (Seen.PERMISSION, Seen.DIALOG)


#: A CLI's recognizer: the screen -> what it shows.
Recognizer = Callable[[Screen], Reading]


def nonblank(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if line.strip()]


_BOX = "│┃╭╮╰╯─━┌┐└┘═║╔╗╚╝▌▐"
# A frame: box-drawing characters (and an ASCII bar) at either end of a line; inside it, only
# box-drawing characters are frame (an ASCII `|` there is text: a command's pipe).
_EDGES = re.compile(rf"^[\s{_BOX}|]+|[\s{_BOX}|]+$")
_INNER = re.compile(rf"[{_BOX}]+")


def text_of(line: str, limit: int = MAX_REASON) -> str:
    """A line without the box-drawing frame around it, as one printable line."""
    return one_line(_INNER.sub(" ", _EDGES.sub(" ", line)), limit)


class Typed(Enum):
    """Where a prompt typed into the CLI's input stands, by the cursor (`typed_at`)."""

    AT_CURSOR = "at cursor"  # it ends where the cursor is: its Enter is not read yet
    NEWLINE = "newline"  # it ends on the line above the cursor's, now blank: Enter was a newline


# A line that only ends a typed prompt's last line (the input wrapped it) counts when it holds at
# least this much of it: a shorter one could end it by chance.
WRAPPED_AT_LEAST = 16


def typed_at(screen: Screen, text: str) -> Typed | None:
    """Where the last line of `text`, just typed, shows by the cursor; None: not by it (the CLI
    took it, or draws something else). Frames and runs of spaces are not compared."""
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines or not 0 <= screen.cursor_row < len(screen.lines):
        return None
    tail = text_of(lines[-1], len(lines[-1]))

    def ends(row: int) -> bool:
        shown = text_of(screen.lines[row], len(screen.lines[row])) if row >= 0 else ""
        wrapped = len(shown) >= min(len(tail), WRAPPED_AT_LEAST) and tail.endswith(shown)
        return bool(shown) and (shown.endswith(tail) or wrapped)

    row = screen.cursor_row
    if ends(row):
        return Typed.AT_CURSOR
    if not text_of(screen.lines[row]) and ends(row - 1):
        return Typed.NEWLINE
    return None


# A question: words ending in '?' (not "? for shortcuts"); the sentence up to it.
_ASKED = re.compile(r"^(.*?\w[\w)'\"]*\s*\?)")


def dialog(
    lines: Sequence[str], *, title: str | None = None, choices: tuple[Choice, ...] = ()
) -> Reading:
    """A dialog whose reason is `title`, else its question (the last line asking one, up to
    its '?'), else its first line of text."""
    if title is None:
        texts = [t for t in (text_of(line) for line in lines) if t]
        questions = [m.group(1) for t in texts if (m := _ASKED.match(t))]
        title = questions[-1] if questions else (texts[0] if texts else "a screen with no text")
    return Reading(Seen.DIALOG, one_line(title), choices=choices)


# ---- the generic reading: CLIs the sidecar has no knowledge of (`shell`, custom CLIs) ----------

# A question for a person on the cursor's line: "Continue? [y/N]", "Overwrite (yes/no)?",
# "Proceed?", "Password:" is not one (a shell's own read of a secret is input, not a choice).
_QUESTION = re.compile(
    r"(\?\s*(\[[^\]]*\]|\([^)]*\))?\s*:?\s*$)|(\[[yY](es)?/[nN]o?\])|(\([yY](es)?/[nN]o?\))",
)
# A menu: a selection marker before an option, or numbered choices ("1. Yes", "2) No").
_MARKER = re.compile(r"^\s*[❯›>▶►→]\s*(\d+[.)]\s*)?\S")
_NUMBERED = re.compile(r"^\s*[❯›>▶►→]?\s*\d+[.)]\s+\S")


def generic(screen: Screen, prompt: re.Pattern[str] | None = None) -> Reading:
    """The reading of a CLI we know nothing about, on a quiet screen (output decides
    `working`). `prompt`: the registry's pattern of its input prompt line (`prompt_pattern`,
    searched in the cursor's line, trailing spaces removed): then anything else is
    a dialog. Without one, a question on the cursor's line or a menu
    near it is a dialog and the rest is its prompt."""
    lines = list(screen.lines)
    at = min(max(screen.cursor_row, 0), len(lines) - 1) if lines else 0
    current = lines[at] if lines else ""
    if prompt is not None:
        if prompt.search(current):
            return Reading(Seen.PROMPT, complete=True)  # its own prompt line, matched
        return dialog(nonblank(lines[: at + 1])[-8:])
    if _QUESTION.search(current.rstrip()):
        # A bare "#?" (bash's select) asks about the lines above it: the nearest with words
        # that is not one of its choices. What a person typed after the question is no part of
        # it (a reason that changed with every key would be an event per key).
        above = [line for line in lines[: at + 1] if not _NUMBERED.match(line)]
        worded = [t for t in map(text_of, above) if any(c.isalpha() for c in t)]
        end = max(m.end() for m in _QUESTION.finditer(current.rstrip()))
        asked = text_of(current[:end])
        title = asked if any(c.isalpha() for c in asked) else (worded or [asked])[-1]
        offered = yes_no(asked) or _numbered(lines[: at + 1])
        # Whole: a question ends the cursor's line (a menu or a prompt may yet be half drawn).
        return Reading(Seen.DIALOG, title, complete=True, choices=offered)
    # A menu: its choices are the last lines drawn, the cursor below them or on one (an old
    # menu scrolled above a later prompt is history, not a question).
    drawn = [i for i in range(at + 1) if lines[i].strip()]
    choices: list[int] = []
    for i in reversed(drawn):
        if not _NUMBERED.match(lines[i]):
            break
        choices.insert(0, i)
    if len(choices) >= 2 or (choices and _MARKER.match(lines[choices[0]])):
        # The menu's title: the line of text just above its first choice.
        above = [text_of(line) for line in lines[: choices[0]]]
        offered = menu(lines[: at + 1], screen.cols) or _numbered(lines[: at + 1])
        return dialog([], title=next((t for t in reversed(above) if t), None), choices=offered)
    return Reading(Seen.PROMPT)


_NUMBER = re.compile(r"^\s*(\d)[.)]\s+(\S.*)$")


def _numbered(lines: Sequence[str]) -> tuple[Choice, ...]:
    """The choices of a line-reading menu (bash's `select`: "1) yes", then "#? "): the last
    run of numbered lines, each chosen by its digit and Enter."""
    found: list[Choice] = []
    for line in reversed(nonblank(lines)):
        if (item := _NUMBER.match(line)) is None:
            if found:
                break
            continue
        found.insert(0, Choice(text_of(item[2]), (DIGITS[int(item[1])], "Enter")))
    return tuple(found) if 2 <= len(found) <= MAX_CHOICES else ()
