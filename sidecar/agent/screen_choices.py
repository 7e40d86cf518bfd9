"""The answers a dialog on screen offers, read as a person reads them: a menu (one line per
choice, the selected one marked, numbered or not, a long label wrapped onto the next lines), a
`[y/N]` or `(yes/no)` question, and what each answer of a permission dialog decides. Each answer
comes with the keys that give it from the screen as it is (the selection counts), so it is read
again right before it is given. Pure, like the recognizers that use it (`sidecar.agent.screens`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sidecar.core.contract import Decision, InputKey
from sidecar.core.text import one_line


@dataclass(frozen=True)
class Choice:
    """One answer a dialog offers: its label as the CLI draws it, the keys (`POST /input`'s
    names) that give it from the screen as it is, or the text to type then submit; in a
    permission dialog, what it decides (`decision`, and `remember`: from now on)."""

    label: str
    keys: tuple[InputKey, ...] = ()
    text: str | None = None
    decision: Decision | None = None
    remember: bool = False


MARKS = "❯›>●▶►→"
_QUOTES = ">›"  # marks that also quote a line or prompt for one
_FRAME = " │┃"
# A longer list is a picker (models, themes) that scrolls: its keys are a person's to press.
MAX_CHOICES = 9
_ITEM = re.compile(rf"(?P<mark>[{MARKS}]\s+)?(?P<num>\d{{1,2}}[.)]\s+)?(?P<label>\S)")
_CELL = re.compile(r"\s{2,}|\s*[│┃]")  # where a label's cell ends: a column gap, a frame


@dataclass(frozen=True)
class _Item:
    at: int  # the line
    indent: int  # where its text begins (frame and spaces before it)
    marked: bool
    number: int | None
    label_at: int  # the column its label begins at


def _item(line: str, at: int) -> _Item | None:
    indent = len(line) - len(line.lstrip(_FRAME))
    found = _ITEM.match(line, indent)
    if found is None or indent >= len(line):
        return None
    number = int(found["num"].rstrip(".) \t")) if found["num"] else None
    return _Item(at, indent, bool(found["mark"]), number, found.start("label"))


def _label(line: str, start: int) -> str:
    return _CELL.split(line[start:].rstrip(), maxsplit=1)[0]


def menu(lines: Sequence[str], width: int, *, digits: bool = False) -> tuple[Choice, ...]:
    """The choices of the last menu on `lines` of a screen `width` columns wide (none: no menu,
    one choice, or a list too long to be a question). Option N is given by its digit where
    `digits` (the CLI picks at once on one), else by Up or Down from the marked one, then
    Enter."""
    marked = [found for at, line in enumerate(lines) if (found := _item(line, at)) and found.marked]
    if not marked:
        return ()
    mark = marked[-1]
    if mark.number is None and lines[mark.at][mark.indent] in _QUOTES:
        return ()  # a quoted or prompted line ("> text"), not a menu: only numbers make it one
    options = _options(lines, mark, width)
    if not 2 <= len(options) <= MAX_CHOICES:
        return ()
    selected = next(i for i, (item, _) in enumerate(options) if item.at == mark.at)
    choices = []
    for i, (item, label) in enumerate(options):
        keys: tuple[InputKey, ...]
        if digits and item.number is not None and 0 <= item.number <= 9:
            keys = (DIGITS[item.number],)
        else:
            move: InputKey = "Down" if i > selected else "Up"
            keys = (*[move] * abs(i - selected), "Enter")
        choices.append(Choice(one_line(label), keys))
    return tuple(choices)


DIGITS: tuple[InputKey, ...] = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9")
_WRAPPED = 12  # a line this near the right edge went on below: its label was wrapped


@dataclass(frozen=True)
class _Menu:
    """The lines around a marked option: which of them are its menu's."""

    lines: Sequence[str]
    mark: _Item

    def member(self, at: int) -> _Item | None:
        """Line `at` as an option or a label's next line; None: not the menu's."""
        mark = self.mark
        if at == mark.at:
            return mark
        if not 0 <= at < len(self.lines) or (found := _item(self.lines[at], at)) is None:
            return None
        if found.indent <= mark.indent:
            return None
        if found.indent < mark.label_at and (found.number is None or mark.number is None):
            return None  # text nearer the margin: a hint under the menu, not a choice
        return found

    def next(self, at: int, step: int) -> int | None:
        """The menu's next line from `at` (`step` 1: down, -1: up); one blank line may part
        two options."""
        for ahead in (at + step, at + 2 * step):
            if self.member(ahead) is not None:
                return ahead
            if not 0 <= ahead < len(self.lines) or self.lines[ahead].strip(_FRAME):
                return None
        return None

    def is_option(self, found: _Item) -> bool:
        if found.marked:
            return True
        if self.mark.number is not None:
            return found.number is not None
        return found.indent == self.mark.label_at


def _options(lines: Sequence[str], mark: _Item, width: int) -> list[tuple[_Item, str]]:
    """The options of the menu whose marked option is `mark`: the lines around it whose text
    begins right of its mark (numbered like it, or at its label's column). A label's next line
    (further right, no number) is joined to it when the label reached the edge (it was
    wrapped); otherwise it is a description, left out."""
    block = _Menu(lines, mark)
    top = mark.at
    while (above := block.next(top, -1)) is not None:
        top = above
    options: list[tuple[_Item, str]] = []
    at: int | None = top
    wrapped = False
    while at is not None:
        found = block.member(at)
        assert found is not None
        label = _label(lines[at], found.label_at)
        if block.is_option(found):
            options.append((found, label))
        elif wrapped and options:
            item, before = options[-1]
            options[-1] = (item, f"{before} {label}")
        wrapped = len(lines[at].rstrip(_FRAME)) >= width - _WRAPPED
        at = block.next(at, 1)
    return options


# A question answered with a letter or a word: "[y/N]", "(Y/n)", "(yes/no)".
_LETTERS = re.compile(r"[\[(][yY]/[nN][\])]")
_WORDS = re.compile(r"[\[(](yes)/(no)\b[^\])]*[\])]", re.IGNORECASE)


def yes_no(question: str) -> tuple[Choice, ...]:
    """The answers of a yes/no question as it writes them: letters are keys, words are typed;
    either is followed by Enter (a line-reading prompt)."""
    if _LETTERS.search(question):  # the capital one is the default; either is a key
        return (Choice("y", ("y", "Enter")), Choice("n", ("n", "Enter")))
    if found := _WORDS.search(question):
        return tuple(Choice(word, text=word.lower()) for word in found.groups())
    return ()


# What a permission dialog's answers decide, by how they begin: the words the CLIs use.
_DENY = re.compile(r"^(no|reject|deny|don't|do not|cancel)\b", re.IGNORECASE)
_ALLOW = re.compile(r"^(yes|allow|approve|proceed|accept|trust)\b", re.IGNORECASE)
_REMEMBER = re.compile(
    r"don't ask again|always|for this session|for the session|from now on", re.IGNORECASE
)
_OTHER = re.compile(r"\bmode\b", re.IGNORECASE)  # "Yes, and switch to auto mode": more than a yes


def decided(choices: Sequence[Choice]) -> tuple[Choice, ...]:
    """`choices` of a permission dialog, each with what it decides when its words say so."""
    out = []
    for choice in choices:
        decision: Decision | None = None
        if _DENY.match(choice.label):
            decision = "deny"
        elif _ALLOW.match(choice.label) and not _OTHER.search(choice.label):
            decision = "allow"
        remember = decision == "allow" and bool(_REMEMBER.search(choice.label))
        out.append(Choice(choice.label, choice.keys, choice.text, decision, remember))
    return tuple(out)
