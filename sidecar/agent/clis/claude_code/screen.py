"""What Claude Code's screen shows (2.1.330, captured in tests/screens/claude-code/)."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

from sidecar.agent.screen_choices import decided, menu
from sidecar.agent.screens import Reading, Screen, Seen, dialog, nonblank, text_of
from sidecar.core.text import one_line

# The input box: a full-width rule, the "❯" line(s) of the prompt, another rule; its footer says
# "esc to interrupt" while a turn runs, above it a spinner line. A permission prompt asks "Do
# you want to ..." (proceed, make this edit, create, fetch) over numbered choices; its title
# (e.g. "Bash command") stands just below the rule that opens it. Anything else is a dialog
# (trust, sign-in, pickers, MCP).
_RULE = re.compile(r"^\s*─{20,}\s*$")
_INPUT = re.compile(r"^\s*[❯>](\s|$)")
_BUSY = re.compile(r"esc to interrupt", re.IGNORECASE)
# The spinner's line while a turn runs: "✢ Kerfuffling… (0s · ↓ 20 tokens)". It is there before
# the footer's "esc to interrupt" when an answered permission prompt gives way (measured); while a
# hook runs it reads "(running PermissionRequest hook · 0s · ...)".
_SPINNER = re.compile(r"^\s*\S\s+\S[^…]*…\s+\((\d|running )")
_WHOLE_SPINNER = re.compile(_SPINNER.pattern + r".*\)\s*$")  # its parenthesis closed
_ASKS = re.compile(r"^\s*Do you want to\b.*\?\s*$")
_DASHED = re.compile(r"^\s*╌{10,}\s*$")


# The last line of a whole frame: a dialog's key hints, or the idle prompt's hint line (a
# frame caught halfway through a redraw lacks it: `Reading.complete`).
_DIALOG_FOOTER = re.compile(r"^\s*(Enter to (confirm|select|continue)|Esc to (cancel|go back))")
_IDLE_HINT = re.compile(r"\? for shortcuts")


def read_screen(screen: Screen) -> Reading:
    """What Claude Code's screen shows (see `sidecar.agent.screens`)."""
    lines = list(screen.lines)
    tail = nonblank(lines)[-4:]
    footed = any(_DIALOG_FOOTER.match(line) for line in tail)
    asks = [i for i, line in enumerate(lines) if _ASKS.match(line)]
    if asks:
        reason = _permission_reason(lines, asks[-1])
        choices = decided(menu(lines[asks[-1] :], screen.cols))
        return Reading(Seen.PERMISSION, reason, complete=footed, choices=choices)
    busy = any(_BUSY.search(line) for line in tail)
    if busy or any(_SPINNER.match(line) for line in lines):
        # Whole: the input box drawn under the work, with the footer that says so or the
        # spinner's line whole (an answered prompt gives way to the spinner first).
        whole = busy or any(_WHOLE_SPINNER.match(line) for line in lines)
        return Reading(Seen.WORKING, complete=whole and _input_box(lines))
    if _input_box(lines):
        return Reading(Seen.PROMPT, complete=any(_IDLE_HINT.search(line) for line in tail))
    reading = dialog(nonblank(lines), choices=menu(lines, screen.cols))
    return replace(reading, complete=footed)


def _input_box(lines: list[str]) -> bool:
    """A prompt line between two rules (the box may hold several lines of typed text)."""
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    return any(
        b - a >= 2 and _INPUT.match(lines[a + 1])
        for a, b in itertools.pairwise(rules)
        if b - a <= 12
    )


def _permission_reason(lines: list[str], ask: int) -> str:
    """'<title>: <what>' of the permission prompt whose question is on line `ask`: the title
    below the rule that opens the prompt, and the first line of the dashed box (the command) or
    else the question itself."""
    opened = max((i for i in range(ask) if _RULE.match(lines[i])), default=-1)
    body = [text_of(line) for line in lines[opened + 1 : ask] if not _DASHED.match(line)]
    body = [t for t in body if t and not t.startswith("Tip:")]
    dashed = [i for i in range(opened + 1, ask) if _DASHED.match(lines[i])]
    what = text_of(lines[dashed[0] + 1]) if dashed else text_of(lines[ask])
    title = body[0] if body else "permission"
    return one_line(f"{title}: {what}" if what != title else title)
