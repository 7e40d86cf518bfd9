"""`GET /egress` and `PATCH /egress`: the allowlist as the proxy applies it now, and changes to it
while the sleeve runs (`sidecar.egress.service` owns the list; this module only speaks HTTP).
"""

from __future__ import annotations

from aiohttp import web
from msgspec import UnsetType

from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.audit.trail import AuditTrail
from sidecar.core.shapes import EgressAnswer, EgressPatch
from sidecar.egress.allowlist import AllowlistError
from sidecar.egress.service import Egress


def egress_operations(egress: Egress, audit: AuditTrail) -> list[Operation]:
    async def show(request: web.Request) -> web.Response:
        return httpio.answer(egress.answer())

    async def patch(request: web.Request) -> web.Response:
        body = await httpio.read_body(request, EgressPatch)
        add = [] if isinstance(body.add, UnsetType) else body.add
        remove = [] if isinstance(body.remove, UnsetType) else body.remove
        try:
            changed = egress.change(add, remove, "api")
        except AllowlistError as exc:
            msg = f"invalid body: {exc} (nothing was changed)"
            raise httpio.BadRequest(msg) from None
        if changed is not None:
            await audit.synced()  # the change is on the trail before it is acknowledged
        return httpio.answer(egress.answer())

    return [
        Operation(
            "GET",
            "/egress",
            show,
            "getEgress",
            "status",
            "The egress allowlist as the proxy applies it now, with its counters",
            {200: EgressAnswer},
            description="`allow` is the whole list (the start list, as changed since); "
            "`added` the patterns added while the sleeve runs (`PATCH /egress`, an egress "
            "approval allowed with `remember`). With an open network, `mode` is `open` and "
            "the lists are empty. The view token is enough.",
        ),
        Operation(
            "PATCH",
            "/egress",
            patch,
            "patchEgress",
            "control",
            "Add patterns to the allowlist or take them off, without restarting the CLI",
            {200: EgressAnswer},
            description="Patterns are checked exactly as `SIDECAR_EGRESS_ALLOW`'s at start; "
            "one bad pattern, or a `remove` not on the list, is a 400 naming it and nothing "
            "changes. The start list can be narrowed too. New connections follow the new list "
            "at once; an open connection that a removed pattern allowed, to a host the list no "
            "longer allows, is closed. Every change is an `egress-changed` event and an audit "
            "record. 409: the sleeve has no allowlist (an open network). The view token may "
            "not change it.",
            body=EgressPatch,
            errors=(400, 409),
        ),
    ]
