"""HTTP routes of agent awareness: `POST /input` (type into the CLI) and
`POST /hooks/{cli}/{event}` (the hooks of a CLI the sidecar started report to it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from msgspec import UnsetType

from sidecar.agent.awareness import Awareness
from sidecar.agent.hooks import HOOK_PATH, SECRET_HEADER
from sidecar.agent.registry import CLIDef
from sidecar.api import httpio
from sidecar.api.openapi import Media, Operation
from sidecar.core.shapes import InputAccepted, InputRequest

log = logging.getLogger(__name__)

# The hook route is public to the API's token check (the CLI never holds the API token) but needs
# the per-launch hook secret, checked in constant time before the body is read: a forged call
# costs one header comparison. Its answer is empty (204: "no decision") except for a permission
# request, which is held until it is answered and then gets the answer in the CLI's format.
AWARENESS = web.AppKey("awareness", Awareness)
# A bigger hook payload (a PostToolUse with a large result) is read no further: its event still
# counts, with an empty payload. A permission request's tool input is listed whole up to this.
MAX_HOOK_BODY = 2 * 1024 * 1024


class HookRefused(Exception):
    """A hook call without the running CLI's secret (403)."""


async def _input(request: web.Request) -> web.Response:
    body = await httpio.read_body(request, InputRequest)
    has_text = not isinstance(body.text, UnsetType)
    given = [not isinstance(value, UnsetType) for value in (body.text, body.keys, body.choice)]
    if sum(given) != 1:
        msg = "invalid body: give exactly one of `text`, `keys` and `choice`"
        raise httpio.BadRequest(msg)
    if not has_text and not isinstance(body.submit, UnsetType):
        msg = "invalid body: `submit` goes with `text` only"
        raise httpio.BadRequest(msg)
    accepted = await request.app[AWARENESS].deliver(body)
    return httpio.answer(accepted, status=202)


async def _hook(request: web.Request) -> web.Response:
    awareness = request.app[AWARENESS]
    cli = request.match_info["cli"]
    if not awareness.hook_secret_matches(cli, request.headers.get(SECRET_HEADER)):
        msg = "hook secret missing or not the running CLI's"
        raise HookRefused(msg)
    event = request.match_info["event"]
    if not awareness.hook_event_known(event):
        msg = f"unknown hook event {event!r}"
        raise httpio.BadRequest(msg)
    payload: dict[str, Any] = {}
    raw = await httpio.read_bounded(request, MAX_HOOK_BODY)
    if raw is not None:
        try:
            decoded = json.loads(raw) if raw.strip() else {}
        except ValueError:
            msg = "hook body is not JSON"
            raise httpio.BadRequest(msg) from None
        if not isinstance(decoded, dict):
            msg = "hook body is not a JSON object"
            raise httpio.BadRequest(msg)
        payload = decoded
    reply = await awareness.hook(event, payload)
    if reply is None:
        return web.Response(status=204)
    return web.json_response(reply)


def agent_operations(
    app: web.Application, awareness: Awareness, registry: Mapping[str, CLIDef]
) -> list[Operation]:
    app[AWARENESS] = awareness
    # The CLIs whose hooks the sidecar installs, by their hooks' URL segment, and their events.
    hooked = {
        known.name: known.hooks.events
        for cli in registry.values()
        if (known := cli.knowledge) is not None and known.hooks is not None
    }
    events = sorted({event for names in hooked.values() for event in names})
    operations = [
        Operation(
            "POST",
            "/input",
            _input,
            "postInput",
            "control",
            "Type into the CLI: text as a paste, named keys, or a dialog's choice",
            {202: InputAccepted},
            description="Exactly one of `text` (pasted literally, bracketed where the CLI "
            "enabled bracketed paste, then Enter if `submit`), `keys`, and `choice` (a label of "
            "`/status`'s `agent.choices`: the screen is read again and the dialog on it given "
            "that answer with its CLI's keys; 409 when it no longer offers it). Nothing is ever "
            "interpreted by tmux or a shell. With `if_state`, the agent's state is checked "
            "right before delivery, under the lock that serialises all typing (409 if it is "
            "not one of them). Keys sent while the agent is `waiting` are held until the prompt "
            "has been on screen long enough to take them (`held`), and the answer waits up to "
            "2 s for the agent to leave `waiting` (`changed`). 409: the CLI is not running.",
            body=InputRequest,
            errors=(400, 409),
        ),
    ]
    if not hooked:  # no CLI here has hooks: no route, whose parameters no value could fit
        return operations
    return [
        *operations,
        Operation(
            "POST",
            f"{HOOK_PATH}/{{cli}}/{{event}}",
            _hook,
            "postHook",
            "status",
            "A CLI's hooks report an event (for the CLI the sidecar started)",
            {
                200: Media("a permission request's answer, in the CLI's own format"),
                204: Media("taken; no decision"),
            },
            description="Called by the hooks the sidecar installs for the CLI it starts; needs "
            f"the per-launch secret in `{SECRET_HEADER}` (no API token). The body is the "
            "hook's JSON input. A permission request is held until it is answered (see "
            "`/approvals`). 400: an unknown event or a body that is not a JSON object; 403: "
            "no or a stale secret, or another CLI's.",
            body=None,
            errors=(400,),
            public=True,
            parameters=(
                {
                    "name": "cli",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": sorted(hooked)},
                },
                {
                    "name": "event",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": events},
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
