"""What opencode's screen shows (1.18.33, captured in tests/screens/opencode/)."""

from __future__ import annotations

import re

from sidecar.agent.screen_choices import Choice, decided
from sidecar.agent.screens import Reading, Screen, Seen, dialog, nonblank
from sidecar.core.contract import InputKey
from sidecar.core.text import one_line

# The input prompt is a box with a heavy left bar: "┃" lines, the last of them the agent and
# model ("┃  Build · Stub Model Stub"), closed by "╹▀▀▀…"; the cursor is in it. The transcript
# uses the same bar for messages and tool output, so the box is known by its closing line and
# the cursor. Under the box a status line says "esc interrupt" while a turn runs (the prompt
# still takes typing). Dialogs are overlays headed "<title> … esc" that take the cursor into
# their search field or hide it; a permission prompt replaces the box: "△ Permission required",
# "<icon> <title>" ("# Shell command"), the command ("$ touch x"), "Allow once  Allow always
# Reject" (then "△ Always allow" asks to confirm the patterns; "△ Reject permission", which asks
# a subagent's reason, is taken from the binary's strings, not seen on screen).

_BOTTOM = re.compile(r"^(\s*)╹▀{5,}")
_BAR = "┃"
_BOX_ROWS = 14  # the box grows with typed text; beyond this it scrolls
_BUSY = re.compile(r"\besc (again to )?interrupt\b")
_DIALOG_HEAD = re.compile(r"\S\s{3,}esc(/enter)?\s*$")
_ASKS = re.compile(r"^△ (Permission required|Always allow|Reject permission)\b")
_ICON = re.compile(r"^\W\s+")  # the tool's icon before a permission's title: # → ← % ⚙ ✱
_COMMAND = re.compile(r"^\$ (.+)$")
_PATTERN = re.compile(r"^- (.+)$")
_PROMPT_ROWS = 10  # a permission prompt's heading, title, command and choices
_BUTTON = re.compile(r"^(Allow|Reject|Confirm|Cancel)\b")
_HINTS = re.compile(r"\b(ctrl\+|enter\b|select\b|⇆)")  # the key hints to the buttons' right


def read_screen(screen: Screen) -> Reading:
    """What opencode's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    cells = [_first_cell(line) for line in lines]
    for at, cell in enumerate(cells):
        if asked := _ASKS.match(cell):
            reason = _permission_reason(asked.group(1), cells[at + 1 :])
            buttons = _buttons(lines[at + 1 :])
            # Whole once its row of buttons is drawn (the last of the prompt's lines).
            return Reading(Seen.PERMISSION, reason, complete=bool(buttons), choices=buttons)
    heads = [line for line in lines if _DIALOG_HEAD.search(line)]
    if heads:
        return dialog(lines, title=_first_cell(heads[0]))
    bottom = _box_bottom(lines)
    status = lines[bottom + 1] if bottom is not None and bottom + 1 < len(lines) else ""
    if _BUSY.search(status) or (bottom is None and _BUSY.search(" ".join(nonblank(lines)[-2:]))):
        return Reading(Seen.WORKING, complete=bool(status))  # the box and its status line
    if bottom is not None and _in_box(screen, bottom):
        return Reading(Seen.PROMPT)  # left to the settled look, as at its start
    return dialog(nonblank(lines)[-12:])


def _buttons(lines: list[str]) -> tuple[Choice, ...]:
    """The permission prompt's answers: a row of buttons ("Allow once   Allow always   Reject"),
    the first selected as it opens (its colour says which is; the text does not), each reached
    with Right, given with Enter."""
    for line in lines[:_PROMPT_ROWS]:
        cells = [c for c in re.split(r"\s{2,}", line.strip(" ┃│")) if c]
        if cells and _BUTTON.match(cells[0]):
            labels = [c for c in cells if not _HINTS.search(c)]
            right: InputKey = "Right"
            return decided(
                tuple(Choice(label, (*[right] * i, "Enter")) for i, label in enumerate(labels))
            )
    return ()


def _box_bottom(lines: list[str]) -> int | None:
    found = [at for at, line in enumerate(lines) if _BOTTOM.match(line)]
    return found[-1] if found else None


def _in_box(screen: Screen, bottom: int) -> bool:
    """Whether the cursor stands in the prompt box that `bottom` closes."""
    lines, row = screen.lines, screen.cursor_row
    found = _BOTTOM.match(lines[bottom])
    left = len(found.group(1)) if found else 0
    if not bottom - _BOX_ROWS <= row < bottom or screen.cursor_col <= left:
        return False
    return all(lines[at][left : left + 1] == _BAR for at in range(row, bottom))


def _permission_reason(title: str, below: list[str]) -> str:
    """'<title>: <command or pattern>' of a permission prompt, from the lines below its
    heading: the tool's own title ("# Shell command") replaces "Permission required"."""
    below = [cell for cell in below[:_PROMPT_ROWS] if cell]
    if title == "Permission required" and below:
        title = _ICON.sub("", below[0])
    for cell in below:
        if found := _COMMAND.match(cell) or _PATTERN.match(cell):
            return f"{title}: {found.group(1)}"
    return title


def _first_cell(line: str) -> str:
    """The first of the columns a line is laid out in (parted by two or more spaces), without
    the bar or frame around it: the sidebar's text shares rows with the transcript. A `|`
    inside it stays: it is a command's pipe, not a frame (`screens.text_of` drops it)."""
    return one_line(re.split(r"\s{2,}", line.strip(" ┃│"), maxsplit=1)[0])
