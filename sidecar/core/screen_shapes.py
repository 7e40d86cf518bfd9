"""The shapes of the CLI's screen, split from `sidecar.core.shapes` (whose bases they use): its
text (`GET /screen`) and the size asked of it (`PUT /screen/size`; the size itself, and the
dialog's choices, are in `/status`: `sidecar.core.shapes`).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from sidecar.core.shapes import Answer, Count, Request


class Cursor(Answer):
    """Where the cursor is, 0-based from the screen's top left."""

    row: Count
    col: Count


class ScreenAnswer(Answer):
    """The CLI pane's visible screen as text, as a person attached sees it."""

    rows: Annotated[int, Meta(ge=1, description="lines on the screen")]
    cols: Annotated[int, Meta(ge=1, description="columns on the screen")]
    lines: Annotated[
        list[str],
        Meta(
            description="exactly `rows` lines, top to bottom, without escape sequences or "
            "trailing spaces; a wide character takes two columns but is one character here"
        ),
    ]
    cursor: Cursor


# Far beyond any screen: the bounds themselves are applied, not refused (a 400 for a phone's
# 50 columns would only make every client clamp first).
_ASKED = Meta(ge=1, le=10_000)


class ScreenSizeRequest(Request):
    """The size wanted for the CLI's screen, in columns and rows: brought within 80x24 and
    250x60 (`SCREEN_MIN`, `SCREEN_MAX`), the sizes every screen recognizer is tested at."""

    cols: Annotated[int, _ASKED]
    rows: Annotated[int, _ASKED]
