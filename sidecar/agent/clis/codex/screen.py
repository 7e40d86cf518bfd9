"""What Codex CLI's screen shows (0.169, captured in tests/screens/codex/)."""

from __future__ import annotations

import itertools
import re

from sidecar.agent.screen_choices import decided, menu
from sidecar.agent.screens import Reading, Screen, Seen, dialog, nonblank, text_of

# The composer (its input prompt) is a "› " line at the foot of the screen, wrapped or typed
# lines below it indented by two spaces, the cursor in it and at most a few footer lines under
# it ("model · cwd", "? for shortcuts"). The transcript repeats each prompt as a "› " line and
# menus mark their choice with "› 1.", so neither the mark alone nor the footer says "prompt":
# the cursor does (dialogs park it elsewhere). While a turn runs, a status line
# "• Working (3s • esc to interrupt)" stands above the composer, which still takes typing.
# An approval replaces the composer: one of the questions below over "› 1. Yes, proceed (y)".

_COMPOSER = re.compile(r"^› (?!\d+\. )")
_CONTINUED = re.compile(r"^ {2}|^$")
_COMPOSER_ROWS = 12  # the composer grows with typed text; beyond this it scrolls
_FOOTER_ROWS = 4  # lines under the composer: status line, hints
_STATUS = re.compile(r"^\S \S.*\(\d[^)]*esc to interrupt\)\s*$")
_APPROVAL = re.compile(
    r"^\s*(Would you like to (run the following command|make the following edits"
    r"|grant these permissions|send input to the existing terminal)\?"
    r"|Do you want to approve network access to .*\?)\s*$"
)
# Approvals other than a command are taken from the binary's strings, not seen on screen.
_YES = re.compile(r"^›?\s*1\. Yes\b")
_COMMAND = re.compile(r"^\s*\$ (.+)$")
_OPTION = re.compile(r"^[›>]?\s*1\. \S")
_LOGO = re.compile(r"^[\s\u2800-\u28ff]*$")  # its animated logo is drawn in braille
_BANNER = re.compile(r"^\s*Welcome to Codex\b")  # heads every sign-in screen: names none
_SELECTED = re.compile(r"^[›>]\s+")
_ASKED = re.compile(r"^(.*?\w[\w)'\"]*\?)(\s|$)")
_GAP = 2  # blank lines that part a pinned dialog from what scrolled above it
# An approval's last line: its key hints ("Press enter to confirm or esc to cancel"); a frame
# without it is still being drawn.
_KEY_HINTS = re.compile(r"^\s*Press enter to confirm or esc to cancel\s*$")


def read_screen(screen: Screen) -> Reading:
    """What Codex CLI's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    for at, line in enumerate(lines):
        if _APPROVAL.match(line) and any(_YES.match(rest) for rest in lines[at + 1 :]):
            choices = decided(menu(lines[at:], screen.cols))
            reason = _approval_reason(lines, at)
            return Reading(Seen.PERMISSION, reason, complete=_hinted(lines), choices=choices)
    if any(_STATUS.match(line) for line in lines):
        return Reading(Seen.WORKING, complete=True)  # the status line, whole to its ")"
    if _in_composer(screen):
        return Reading(Seen.PROMPT)
    # Its prompt and its other dialogs wait for the settled look: a look at every frame of its
    # start read a dialog there that the settled look never sees (`waiting` from `starting`
    # in 1 of 2 runs of its approval test).
    return dialog(lines, title=_title(lines), choices=menu(lines, screen.cols))


def _hinted(lines: list[str]) -> bool:
    """Whether the last line drawn is an approval's key hints (the frame is whole)."""
    drawn = nonblank(lines)
    return bool(drawn) and _KEY_HINTS.search(drawn[-1]) is not None


def _in_composer(screen: Screen) -> bool:
    lines, row = screen.lines, screen.cursor_row
    if not 0 <= row < len(lines) or screen.cursor_col < 2:
        return False
    if len(nonblank(lines[row + 1 :])) > _FOOTER_ROWS:
        return False
    for top in range(row, max(row - _COMPOSER_ROWS, -1), -1):
        if _COMPOSER.match(lines[top]):
            return True
        if not _CONTINUED.match(lines[top]):
            return False
    return False


def _approval_reason(lines: list[str], at: int) -> str:
    """'shell command: <command>' for a command, else the approval's question."""
    for line in lines[at + 1 :]:
        if _YES.match(line):
            break
        if found := _COMMAND.match(line):
            return f"shell command: {found.group(1).strip()}"
    return text_of(lines[at])


def _title(lines: list[str]) -> str | None:
    """A dialog's question (the last, up to its '?'), else the line above its first choice,
    else its first line; looked for below the widest gap, which parts a dialog pinned to the
    foot of the screen from what scrolled above it."""
    texts = [
        line
        for line in lines[_below_widest_gap(lines) :]
        if text_of(line) and not _LOGO.match(line) and not _BANNER.match(line)
    ]
    asked = [found.group(1) for line in texts if (found := _ASKED.match(text_of(line)))]
    if asked:
        return asked[-1]
    for before, line in itertools.pairwise(texts):
        if _OPTION.match(line):
            return _first_cell(before)
    return _first_cell(texts[0]) if texts else None


def _below_widest_gap(lines: list[str]) -> int:
    """The first line after the widest run of blank lines between lines of text (0: none)."""
    start, widest, blank, text = 0, _GAP, 0, False
    for at, line in enumerate(lines):
        if not line.strip():
            blank += 1
            continue
        if text and blank >= widest:
            start, widest = at, blank
        text, blank = True, 0
    return start


def _first_cell(line: str) -> str:
    """The first of the columns a line is laid out in (parted by two or more spaces), without
    the mark of a selected line."""
    return text_of(re.split(r"\s{2,}", _SELECTED.sub("", line.strip()))[0])
