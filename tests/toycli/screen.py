"""What the toy CLI's screen shows, read on the cursor's line: its prompt `toy> `, `working`
while a turn runs, or its permission dialog's `choice> ` under "Allow toy to run: <command>?";
anything else is a dialog."""

from __future__ import annotations

import re

from sidecar.agent.screens import Reading, Screen, Seen, dialog, nonblank

_ASKS = re.compile(r"^Allow toy to run: (.+)\?$")


def read_screen(screen: Screen) -> Reading:
    lines = list(screen.lines)
    row = screen.cursor_row
    current = lines[row] if 0 <= row < len(lines) else ""
    if current.startswith("toy>"):  # its trailing space is trimmed (`sidecar.pane.screen`)
        return Reading(Seen.PROMPT)
    if current.startswith("working"):
        return Reading(Seen.WORKING)
    if current.startswith("choice>"):
        asked = [found.group(1) for line in lines[:row] if (found := _ASKS.match(line))]
        return Reading(Seen.PERMISSION, f"run: {asked[-1]}" if asked else "run")
    return dialog(nonblank(lines[: row + 1])[-8:])
