"""`POST /telemetry/{cli}/v1/logs` (a CLI's own usage reports: OTLP/HTTP JSON logs, to a
receiver on the sidecar's port that needs the per-launch secret, never the API token), its
`/v1/traces` and `/v1/metrics` (taken and dropped: a CLI exporting all three to one endpoint) and
`PATCH /budget` (the sleeve's spending limit). `sidecar.agent.spending` counts and acts.
"""

from __future__ import annotations

from aiohttp import web

from sidecar.agent.spending import Spending
from sidecar.api import httpio
from sidecar.api.openapi import Operation
from sidecar.core.shapes import BudgetInfo, BudgetRequest, OtlpAnswer
from sidecar.usage import otlp
from sidecar.usage.otlp import BadBody
from sidecar.usage.reports import BadReport
from sidecar.usage.telemetry import SECRET_HEADER, TELEMETRY_PATH

# Claude Code's batches of logs are a few kB to a few hundred; a request past this is refused
# before it is read further (413).
MAX_TELEMETRY_BODY = 4 * 1024 * 1024


class TelemetryRefused(Exception):
    """A usage report without the running CLI's telemetry secret (401: nothing is counted)."""


class TelemetryTooLarge(Exception):
    """A usage report over MAX_TELEMETRY_BODY (413)."""


CLI_PARAMETERS = (
    {"name": "cli", "in": "path", "required": True, "schema": {"type": "string"}},
    {"name": SECRET_HEADER, "in": "header", "required": True, "schema": {"type": "string"}},
)


def usage_operations(spending: Spending) -> list[Operation]:
    async def body_of(request: web.Request) -> bytes:
        """The body of a request from the running CLI: its secret checked first."""
        cli = request.match_info["cli"]
        if not spending.secret_matches(cli, request.headers.get(SECRET_HEADER)):
            msg = "telemetry secret missing or not the running CLI's: nothing was counted"
            raise TelemetryRefused(msg)
        raw = await httpio.read_bounded(request, MAX_TELEMETRY_BODY)
        if raw is None:
            msg = f"telemetry request over {MAX_TELEMETRY_BODY} bytes: nothing was counted"
            raise TelemetryTooLarge(msg)
        return raw

    async def telemetry(request: web.Request) -> web.Response:
        raw = await body_of(request)
        try:
            spending.report(raw, request.content_type)
        except (BadBody, BadReport) as exc:
            msg = f"telemetry refused, nothing of it counted: {exc}"
            raise httpio.BadRequest(msg) from None
        return httpio.answer(OtlpAnswer(partial_success={}))

    def dropped(signal: str) -> Operation:
        async def drop(request: web.Request) -> web.Response:
            raw = await body_of(request)
            try:
                otlp.request(raw, signal)
            except BadBody as exc:
                msg = f"telemetry refused: {exc}"
                raise httpio.BadRequest(msg) from None
            return httpio.answer(OtlpAnswer(partial_success={}))

        return Operation(
            "POST",
            f"{TELEMETRY_PATH}/{{cli}}/v1/{signal}",
            drop,
            f"postTelemetry{signal.title()}",
            "status",
            f"A CLI's own OTLP/HTTP {signal} (JSON), taken and dropped",
            {200: OtlpAnswer},
            description=f"For a CLI that exports its {signal} to the same endpoint as its logs "
            "(Gemini CLI): the same secret and limits as the logs; nothing in them is counted "
            f"or relayed. 400: not an OTLP JSON {signal} request.",
            errors=(400, 401, 413),
            public=True,
            parameters=CLI_PARAMETERS,
            raw_body={"type": "object", "required": [otlp.RESOURCES[signal]]},
        )

    async def change(request: web.Request) -> web.Response:
        body = await httpio.read_body(request, BudgetRequest)
        return httpio.answer(spending.change(body.usd, body.tokens))

    return [
        Operation(
            "POST",
            f"{TELEMETRY_PATH}/{{cli}}/v1/logs",
            telemetry,
            "postTelemetryLogs",
            "status",
            "A CLI's own usage reports (OTLP/HTTP logs, JSON), for the CLI the sidecar started",
            {200: OtlpAnswer},
            description="The CLI's OpenTelemetry logs exporter posts here (the sidecar sets it "
            f"up at launch). Needs the per-launch secret in `{SECRET_HEADER}` (no API token): "
            "401 without it, and nothing is counted. 400: not an OTLP JSON logs request, or a "
            "model request with negative or impossible counts (nothing of the request is "
            f"counted); 413: over {MAX_TELEMETRY_BODY} bytes. Each model request in it becomes "
            "a `usage` event; the request is sent on to the user's own OTLP destination.",
            errors=(400, 401, 413),
            public=True,
            parameters=CLI_PARAMETERS,
            raw_body={"type": "object", "required": ["resourceLogs"]},
        ),
        dropped("traces"),
        dropped("metrics"),
        Operation(
            "PATCH",
            "/budget",
            change,
            "patchBudget",
            "control",
            "Change the sleeve's spending limit",
            {200: BudgetInfo},
            description="`usd` and `tokens`: a number sets that limit, null clears it, a field "
            "left out keeps it. A limit raised above what is spent lets the agent go on: "
            "approvals are asked again, `/input` takes text, the agent leaves `waiting`. "
            "The view token may not change it.",
            body=BudgetRequest,
            errors=(400,),
        ),
    ]
