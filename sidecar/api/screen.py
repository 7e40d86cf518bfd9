"""`GET /screen`: the CLI pane's visible screen as text, and `PUT /screen/size`: its size; both
through the sidecar's own tmux control client (`sidecar.pane.screen`): no process per request.
"""

from __future__ import annotations

from aiohttp import web

from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.core.screen_shapes import Cursor, ScreenAnswer, ScreenSizeRequest
from sidecar.core.shapes import ScreenSize
from sidecar.core.states import ProcState
from sidecar.pane.protocol import ControlError
from sidecar.pane.screen import Screen
from sidecar.process.supervisor import Supervisor

# The CLI is on its way (a start, a heal): tmux will have a pane again shortly.
COMING = (ProcState.STARTING, ProcState.RUNNING, ProcState.BACKOFF)


class NoScreen(Exception):
    """There is no pane to look at: the CLI is not running and tmux has no pane of it (409)."""


def screen_answer(screen: Screen) -> ScreenAnswer:
    return ScreenAnswer(
        rows=screen.rows,
        cols=screen.cols,
        lines=list(screen.lines),
        cursor=Cursor(row=screen.cursor_row, col=screen.cursor_col),
    )


def screen_operations(sup: Supervisor) -> list[Operation]:
    async def resize(request: web.Request) -> web.Response:
        body = await httpio.read_body(request, ScreenSizeRequest)
        cols, rows = await sup.awareness.resize(body.cols, body.rows)
        return httpio.answer(ScreenSize(cols=cols, rows=rows))

    async def screen(request: web.Request) -> web.Response:
        try:
            found = await sup.awareness.look()
        except ControlError:
            # No pane and none coming is the state of things (409); anything else passes
            # (503: tmux restarting, a heal, a look that timed out).
            state = sup.cli.state
            if sup.pane is None and state not in COMING:
                msg = f"no screen: the CLI is {state.value} and tmux has no pane of it"
                raise NoScreen(msg) from None
            raise
        return httpio.answer(screen_answer(found))

    return [
        Operation(
            "GET",
            "/screen",
            screen,
            "getScreen",
            "status",
            "The CLI pane's visible screen as text, as a person attached sees it",
            {200: ScreenAnswer},
            description="Asked of tmux through the sidecar's control client (no process per "
            "request). After the CLI exited, the pane tmux keeps (`remain-on-exit`) is shown as "
            "tmux shows it. 409: there is no pane (the CLI is not running and tmux has none); "
            "503: tmux could not be asked right now (it is restarting, or did not answer within "
            "1 s): retry after `Retry-After` seconds. The view token is enough.",
            errors=(409, 503),
        ),
        Operation(
            "PUT",
            "/screen/size",
            resize,
            "putScreenSize",
            "control",
            "Size the CLI's screen (the tmux window it draws in)",
            {200: ScreenSize},
            description="The size is brought within 80x24 and 250x60, the sizes every screen "
            "recognizer is tested at; the answer is the size the screen has then, and a "
            "`screen-resized` event tells every viewer. The CLI redraws itself for it. The "
            "dashboard of a writer asks for its terminal panel's size when it opens, when its "
            "window changes size, and when a person clicks into its terminal; attached tmux "
            "clients never resize it. 503: tmux could not be asked right now; view token 403.",
            body=ScreenSizeRequest,
            errors=(400, 503),
        ),
    ]
