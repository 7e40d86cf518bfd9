"""HTTP routes of agent awareness: `POST /input` (type into the CLI) and
`POST /hooks/claude-code/{event}` (Claude Code's hooks report to the sidecar).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from msgspec import UnsetType

from sidecar import httpio
from sidecar.awareness import Awareness
from sidecar.claude_code import EVENTS, HOOK_PATH, SECRET_HEADER
from sidecar.openapi import Media, Operation
from sidecar.shapes import InputAccepted, InputRequest

log = logging.getLogger(__name__)

# The hook route is public to the API's token check (the CLI never holds the API token) but needs
# the per-launch hook secret, checked in constant time before the body is read: a forged call
# costs one header comparison. Its answer is always empty (204): Claude Code takes an empty 2xx
# as "no decision", so nothing the sidecar answers can approve or deny a tool.
AWARENESS = web.AppKey("awareness", Awareness)
MAX_HOOK_BODY = 256 * 1024  # a bigger hook payload (a PostToolUse with a large result) is skipped


class HookRefused(Exception):
    """A hook call without the running CLI's secret (403)."""


async def _input(request: web.Request) -> web.Response:
    body = await httpio.read_body(request, InputRequest)
    has_text = not isinstance(body.text, UnsetType)
    if has_text == (not isinstance(body.keys, UnsetType)):
        msg = "invalid body: give exactly one of `text` and `keys`"
        raise httpio.BadRequest(msg)
    if not has_text and not isinstance(body.submit, UnsetType):
        msg = "invalid body: `submit` goes with `text`, not with `keys`"
        raise httpio.BadRequest(msg)
    accepted = await request.app[AWARENESS].deliver(body)
    return httpio.answer(accepted, status=202)


async def _hook(request: web.Request) -> web.Response:
    awareness = request.app[AWARENESS]
    if not awareness.hook_secret_matches(request.headers.get(SECRET_HEADER)):
        msg = "hook secret missing or not the running CLI's"
        raise HookRefused(msg)
    event = request.match_info["event"]
    if event not in EVENTS:
        msg = f"unknown hook event {event!r}"
        raise httpio.BadRequest(msg)
    payload: dict[str, Any] = {}
    if request.content_length is None or request.content_length <= MAX_HOOK_BODY:
        raw = await request.read()
        try:
            decoded = json.loads(raw) if raw.strip() else {}
        except ValueError:
            msg = "hook body is not JSON"
            raise httpio.BadRequest(msg) from None
        if not isinstance(decoded, dict):
            msg = "hook body is not a JSON object"
            raise httpio.BadRequest(msg)
        payload = decoded
    awareness.hook(event, payload)
    return web.Response(status=204)


def agent_operations(app: web.Application, awareness: Awareness) -> list[Operation]:
    app[AWARENESS] = awareness
    return [
        Operation(
            "POST",
            "/input",
            _input,
            "postInput",
            "control",
            "Type into the CLI: text as a paste, or named keys",
            {202: InputAccepted},
            description="Exactly one of `text` (pasted literally, bracketed where the CLI "
            "enabled bracketed paste, then Enter if `submit`) and `keys`. Nothing is ever "
            "interpreted by tmux or a shell. With `if_state`, the agent's state is checked "
            "right before delivery, under the lock that serialises all typing (409 if it is "
            "not one of them). Keys sent while the agent is `waiting` are held until the prompt "
            "has been on screen long enough to take them (`held`), and the answer waits up to "
            "2 s for the agent to leave `waiting` (`changed`). 409: the CLI is not running.",
            body=InputRequest,
            errors=(400, 409),
        ),
        Operation(
            "POST",
            f"{HOOK_PATH}/{{event}}",
            _hook,
            "postClaudeCodeHook",
            "status",
            "Claude Code's hooks report an event (for the CLI the sidecar started)",
            {204: Media("taken; the answer is empty, so it never changes the CLI's decisions")},
            description="Called by the hooks the sidecar installs with `--settings`; needs the "
            f"per-launch secret in `{SECRET_HEADER}` (no API token). The body is the hook's "
            "JSON input. 400: an unknown event or a body that is not a JSON object; 403: no "
            "or a stale secret.",
            body=None,
            errors=(400,),
            public=True,
            parameters=(
                {
                    "name": "event",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": list(EVENTS)},
                },
                {
                    "name": SECRET_HEADER,
                    "in": "header",
                    "required": True,
                    "schema": {"type": "string"},
                },
            ),
            raw_body={"type": "object"},
        ),
    ]
