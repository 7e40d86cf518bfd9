"""What Gemini CLI's screen shows (0.61, captured in tests/screens/gemini-cli/)."""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.agent.screen_choices import decided, menu
from sidecar.agent.screens import Reading, Screen, Seen, dialog, nonblank, text_of

# Gemini CLI draws inline: what it drew before (a dialog already answered, the transcript) stays
# on screen above what it draws now. Its input prompt sits under a full-width rule and a mode
# line ("Shift+Tab to accept edits"): " > " (" ! " in shell mode, " * " in YOLO mode), typed
# lines below it indented, the cursor in it. The transcript repeats each prompt as a " > " line
# too, with no rule above it. While a turn runs a spinner line "⠴ Thinking... (esc to cancel,
# 3s)" stands above the rule and the prompt still takes typing. Dialogs are boxes (╭ ... ╰) that
# replace the prompt; a tool's confirmation is one whose choices begin "1. Allow once", headed
# "? <tool>  <what>" (seen for Shell; the bundle gives edits, MCP tools and fetches the same).

_RULE = re.compile(r"^─{20,}\s*$")
_INPUT = re.compile(r"^ [>!*] ")
_CONTINUED = re.compile(r"^ {3}|^$")
_INPUT_ROWS = 12  # the input grows with typed text; beyond this it scrolls
_ABOVE_INPUT = 4  # rows between the rule and the input: the mode line and blank lines
_SPINNER = re.compile(r"\(esc to cancel, \d")
_WHOLE_SPINNER = re.compile(r"\(esc to cancel, \d[^)]*\)")
# Where the spinner stands while hooks run ("Executing Hooks: sidecar (1/2), mine (2/2)"), gone
# once they are done.
_HOOKS = re.compile(r"^\s*Executing Hooks?: ")
_RECENT = 10  # the spinner line is among the last lines drawn
# A spinner's glyph (braille) heading a line: the spinner line, or the hooks line, as drawn so
# far ("⠴ Exe" caught halfway).
_SPINNING = re.compile(r"^\s*[\u2800-\u28ff]\s")
# A tool's box in the transcript: its status mark (o pending, a spinner's glyph running, ✓
# done, x failed, - cancelled) before the tool's name. Not "?" (awaiting confirmation): a
# dialog's title may carry one too, and a shape not known stays a dialog.
_TOOL_HEAD = re.compile(r"^│ ([o✓x✗⊷-]|[\u2800-\u28ff]) +\S")
_ALLOW = re.compile(r"^(●\s*)?1\. Allow once$")
_TOOL = re.compile(r"^[│\s]*\? (.+?)\s*│?\s*$")
_BOX_TOP = re.compile(r"^\s*╭")
_BOX_BOTTOM = re.compile(r"^\s*╰")
_ASKED = re.compile(r"^(.*?\w[\w)'\"]*\?)(\s|$)")
_MARK = re.compile(r"^[>?●]\s+")  # a box's title may carry a focus or question mark
# A dialog box's key hints: "(Use Enter to select)", "(Press Enter to submit, Esc to cancel)".
_HINTS = re.compile(r"^\((Use|Press) Enter\b")


def read_screen(screen: Screen) -> Reading:
    """What Gemini CLI's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    for at, line in enumerate(lines):
        if _ALLOW.match(text_of(line)):
            # A digit picks its choice at once there (measured on 0.61).
            choices = decided(menu(lines, screen.cols, digits=True))
            # Whole once its box is closed under the choices.
            closed = any(_BOX_BOTTOM.match(line) for line in lines[at + 1 :])
            reason = _tool_reason(lines, at)
            return Reading(Seen.PERMISSION, reason, complete=closed, choices=choices)
    recent = nonblank(lines)[-_RECENT:]
    if any(_SPINNER.search(line) or _HOOKS.match(line) or _SPINNING.match(line) for line in recent):
        # Hooks running: at the start, after the prompt is drawn (with the cursor in it), and
        # an Enter typed then is a newline, not a submission. Not idle until they are done.
        whole = any(_WHOLE_SPINNER.search(line) for line in recent)
        return Reading(Seen.WORKING, complete=whole)
    if _in_input(screen):
        # Never known whole: 0.61 draws its prompt, then runs its SessionStart hooks (above).
        return Reading(Seen.PROMPT)
    box, closed = _last_box(lines)
    choices = menu(box, screen.cols)
    if not choices and any(_TOOL_HEAD.match(line) for line in box[:1]):
        # A tool's box with nothing under it: drawn before its spinner, its hooks line or its
        # confirmation (the Notification hook is awaited first), a frame of work half drawn.
        return Reading(Seen.WORKING)
    # Whole: a closed box offering choices or saying its keys.
    hinted = any(_HINTS.match(text_of(line)) for line in box)
    reading = dialog(box, title=_title(box), choices=choices)
    return replace(reading, complete=closed and (bool(choices) or hinted))


def _in_input(screen: Screen) -> bool:
    lines, row = screen.lines, screen.cursor_row
    if not 0 <= row < len(lines) or screen.cursor_col < 3:
        return False
    for top in range(row, max(row - _INPUT_ROWS, -1), -1):
        if _INPUT.match(lines[top]):
            above = lines[max(top - _ABOVE_INPUT, 0) : top]
            return any(_RULE.match(line) for line in above)
        if not _CONTINUED.match(lines[top]):
            return False
    return False


def _tool_reason(lines: list[str], allow: int) -> str:
    """'<tool>: <what>' from the confirmation's heading ("? Shell  touch x"), else its
    question."""
    for line in reversed(lines[:allow]):
        if found := _TOOL.match(line):
            cells = re.split(r"\s{2,}", found.group(1), maxsplit=1)
            return text_of(": ".join(cells))
        if _BOX_TOP.match(line):
            break
    asked = [text_of(line) for line in lines[:allow] if text_of(line).endswith("?")]
    return asked[-1] if asked else "a tool"


def _last_box(lines: list[str]) -> tuple[list[str], bool]:
    """The lines of the last box drawn (the dialog up now), else the last lines of text; and
    whether the box is closed."""
    tops = [at for at, line in enumerate(lines) if _BOX_TOP.match(line)]
    if not tops:
        return nonblank(lines)[-8:], False
    box: list[str] = []
    for line in lines[tops[-1] + 1 :]:
        if _BOX_BOTTOM.match(line):
            return box, True
        box.append(line)
    return box, False


def _title(box: list[str]) -> str | None:
    """A dialog's question (up to its '?'), else its first line."""
    texts = [t for t in (text_of(line) for line in box) if t]
    for text in texts:
        if asked := _ASKED.match(text):
            return asked.group(1)
    if not texts:
        return None
    first = next(line for line in box if text_of(line))
    cell = re.split(r"\s{2,}", first.strip(" │"), maxsplit=1)[0]
    return _MARK.sub("", text_of(cell)) or texts[0]
