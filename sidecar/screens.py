"""What a CLI's screen says about its agent, as a person looking at it would read it: its input
prompt (it takes a typed prompt), a permission prompt, some other dialog that needs a person, or
work in progress. The vocabulary and the generic reading live here; each CLI's own knowledge of
its screen lives beside its other definitions (`sidecar.claude_code`, ...), all pure.

The rule every recognizer follows: a screen that is neither the input prompt nor work in
progress is a dialog, so a shape never seen before reads as `waiting`, never as `idle`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

from sidecar.agent import one_line
from sidecar.screen import Screen


class Seen(Enum):
    PROMPT = "prompt"  # the input prompt: a typed prompt is taken
    PERMISSION = "permission"  # the CLI asks whether it may run a tool
    DIALOG = "dialog"  # any other screen that needs a person (first start, trust, picker...)
    WORKING = "working"  # work in progress on screen (a spinner, "esc to interrupt")


@dataclass(frozen=True)
class Reading:
    seen: Seen
    reason: str | None = None  # PERMISSION / DIALOG: the question or title line, one line

    @property
    def needs_person(self) -> bool:
        return self.seen in (Seen.PERMISSION, Seen.DIALOG)


#: A CLI's recognizer: the screen -> what it shows.
Recognizer = Callable[[Screen], Reading]


def nonblank(lines: Sequence[str]) -> list[str]:
    return [line for line in lines if line.strip()]


_FRAME = re.compile(r"[\s│┃|╭╮╰╯─━┌┐└┘═║╔╗╚╝▌▐]+")


def text_of(line: str) -> str:
    """A line without the box-drawing frame around it, as one printable line."""
    return one_line(_FRAME.sub(" ", line))


def dialog(lines: Sequence[str], *, title: str | None = None) -> Reading:
    """A dialog whose reason is `title`, else its question line (the last line ending in '?'),
    else its first line of text."""
    if title is None:
        texts = [text_of(line) for line in lines]
        texts = [t for t in texts if t]
        questions = [t for t in texts if t.rstrip().endswith("?")]
        title = questions[-1] if questions else (texts[0] if texts else "a screen with no text")
    return Reading(Seen.DIALOG, one_line(title))


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
    `working`). `prompt`: the registry's pattern of its input prompt line (`prompt_pattern`):
    then anything else is a dialog. Without one, a question on the cursor's line or a menu
    near it is a dialog and the rest is its prompt."""
    lines = list(screen.lines)
    at = min(max(screen.cursor_row, 0), len(lines) - 1) if lines else 0
    current = lines[at] if lines else ""
    if prompt is not None:
        if any(prompt.search(line) for line in lines[: at + 1][-3:]):
            return Reading(Seen.PROMPT)
        return dialog(nonblank(lines[: at + 1])[-8:])
    if _QUESTION.search(current.rstrip()):
        return Reading(Seen.DIALOG, text_of(current))
    near = lines[max(0, at - 8) : at + 4]
    numbered = [line for line in near if _NUMBERED.match(line)]
    if len(numbered) >= 2 or (numbered and any(_MARKER.match(line) for line in near)):
        before = [line for line in lines[: at + 1] if line.strip() and line not in numbered]
        return dialog(before[-6:])
    return Reading(Seen.PROMPT)
