"""The OpenAPI document: generated from the route table and the typed shapes, valid OpenAPI 3.1,
complete for the contract, and describing exactly the routes the app serves."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from openapi_schema_validator import OAS31Validator

from sidecar.agent.registry import load_registry
from sidecar.api.app import OPENAPI, create_app
from sidecar.config import Config
from sidecar.core.events import EventBus
from sidecar.process.supervisor import Supervisor

METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}

# The routes of CONTRACT.md, with their methods.
CONTRACT_ROUTES = {
    "/health": {"get"},
    "/status": {"get"},
    "/outbox": {"get"},
    "/outbox/ack": {"post"},
    "/inbox": {"get", "post"},
    "/resleeve": {"post"},
    "/events": {"get"},
    "/terminal": {"get"},
    "/terminal/ws": {"get"},
    "/": {"get"},
    "/openapi.json": {"get"},
    "/metrics": {"get"},
    "/screen": {"get"},
    "/recordings": {"get"},
    "/recordings/{id}": {"get"},
    "/budget": {"patch"},
}


def make_app(**config: Any) -> web.Application:
    cfg = Config(sleeve_name="doc", cli="shell", **config)
    return create_app(Supervisor(cfg, load_registry(None), EventBus()))


def document(app: web.Application) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(app[OPENAPI])
    return result


@pytest.fixture(params=["open", "secured"])
def spec(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The document of a sidecar without a token, and of one with tokens."""
    if request.param == "secured":
        return document(make_app(token="t0ken-admin", view_token="t0ken-view"))
    return document(make_app())


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve(spec: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), f"only local refs are used: {ref}"
    node: Any = spec
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        assert isinstance(node, dict) and part in node, f"unresolved $ref {ref}"
        node = node[part]
    return node


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def conforms(spec: dict[str, Any], name: str, value: Any) -> bool:
    """`value` against the named component schema, by a real JSON Schema 2020-12 validator."""
    schema = {"$ref": f"#/components/schemas/{name}", "components": spec["components"]}
    return bool(OAS31Validator(schema).is_valid(value))


# --- validity ---------------------------------------------------------------------------------


def test_validates_with_openapi_spec_validator(spec: dict[str, Any]) -> None:
    import openapi_spec_validator as validator

    assert spec["openapi"] == "3.1.0"
    validator.validate(spec)


def test_structure_is_sound(spec: dict[str, Any]) -> None:
    tags = {t["name"] for t in spec["tags"]}
    seen_ids: set[str] = set()
    for path, method, op in operations(spec):
        assert op["operationId"] not in seen_ids, (path, method)
        seen_ids.add(op["operationId"])
        assert set(op["tags"]) <= tags, (path, method)
        assert op["summary"], (path, method)
        assert "default" in op["responses"], (path, method)
        assert any(code.startswith(("1", "2", "3")) for code in op["responses"]), (path, method)


def test_every_ref_resolves_and_every_schema_is_used(spec: dict[str, Any]) -> None:
    used = set(refs(spec))
    for ref in used:
        resolve(spec, ref)
    schemas = {f"#/components/schemas/{name}" for name in spec["components"]["schemas"]}
    assert schemas <= used, schemas - used


def test_security_is_described_exactly_when_a_token_is_set() -> None:
    secured = document(make_app(token="t0ken-admin"))
    schemes = secured["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    assert secured["security"]
    assert secured["paths"]["/health"]["get"]["security"] == []
    assert "401" not in secured["paths"]["/health"]["get"]["responses"]
    assert "401" in secured["paths"]["/status"]["get"]["responses"]
    # Without a token nothing asks for one, and the document says so (a fuzzer checks it); the
    # CLI's usage reports answer 401 for a secret of their own, token or not.
    open_doc = document(make_app())
    assert "security" not in open_doc
    assert "securitySchemes" not in open_doc["components"]
    assert all(
        "401" not in op["responses"]
        for path, _, op in operations(open_doc)
        if not path.startswith("/telemetry/")
    )


def test_documented_routes_are_exactly_the_served_routes() -> None:
    app = make_app(token="t0ken-admin")
    served = {
        (info.get("path") or info.get("formatter"), route.method.lower())
        for route in app.router.routes()
        for info in [route.resource.get_info()]
        if route.resource is not None
        if route.method != "HEAD"
    }
    documented = {(path, method) for path, method, _ in operations(document(app))}
    assert served == documented


def test_every_contract_route_is_described(spec: dict[str, Any]) -> None:
    for path, methods in CONTRACT_ROUTES.items():
        assert path in spec["paths"], path
        assert methods <= set(spec["paths"][path]), path


def test_resleeve_enum_is_the_cli_names(spec: dict[str, Any]) -> None:
    cli = spec["components"]["schemas"]["ResleeveRequest"]["properties"]["cli"]
    assert cli["enum"] == ["claude-code", "codex", "gemini-cli", "opencode", "shell"]


def test_media_types(spec: dict[str, Any]) -> None:
    events = spec["paths"]["/events"]["get"]["responses"]["200"]["content"]
    assert set(events) == {"application/x-ndjson"}
    assert set(spec["paths"]["/"]["get"]["responses"]["200"]["content"]) == {"text/html"}
    status = spec["paths"]["/status"]["get"]["responses"]["200"]["content"]
    assert set(status) == {"application/json"}


def test_error_answers_use_the_error_schema(spec: dict[str, Any]) -> None:
    for path, _, op in operations(spec):
        for code, response in op["responses"].items():
            if code == "default" or int(code) >= 400:
                content = resolve(spec, response["$ref"])["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (path, code)


def test_answers_allow_additions_and_requests_do_not(spec: dict[str, Any]) -> None:
    bodies = [
        op["requestBody"]["content"]["application/json"]["schema"]
        for _, _, op in operations(spec)
        if "requestBody" in op
    ]
    # Claude Code's hook input is its own (any JSON object); every body of ours is closed.
    assert {"type": "object"} in bodies
    requests = {b["$ref"].rsplit("/", 1)[1] for b in bodies if "$ref" in b}
    assert requests == {
        "NewMessage",
        "AckRequest",
        "ResleeveRequest",
        "InputRequest",
        "ApprovalRequest",
        "EgressPatch",
        "ScreenSizeRequest",
        "BudgetRequest",
        "PushSubscription",
        "PushEndpoint",
    }
    requests.add("PushKeys")  # inside PushSubscription: closed like the body around it
    for name, item in spec["components"]["schemas"].items():
        if item.get("type") == "object":
            assert (item.get("additionalProperties", True) is False) is (name in requests), name


# --- the contract's payloads conform ----------------------------------------------------------

MESSAGE = {
    "id": "m-1",
    "from": "envoy",
    "to": None,
    "thread": None,
    "type": "task",
    "content": "Do it\n\n---\nwith a rule",
    "timestamp": "2026-11-22T07:00:00Z",
}
STATUS = {
    "sleeve_id": "s1",
    "status": "working",
    "current_task": "Implementing user authentication module",
    "progress": {"total": 5, "completed": 2},
    "blockers": [],
    "next_steps": [],
    "cli": "claude-code",
    "cli_pid": 42,
    "cli_running": True,
    "cli_state": "running",
    "cli_exit_code": None,
    "resleeving": False,
    "ttyd_state": "running",
    "last_activity": None,
    "health": "healthy",
    "repo": None,
    "warnings": [],
    "sidecar_restarts": 0,
    "agent": {
        "state": "waiting",
        "since": "2026-11-22T07:00:00.000Z",
        "reason": "permission for Bash: rm -rf build",
        "source": "hooks",
        "session_id": "0b6f3c0e-8f7e-4a59-9f0e-3d2b1c4a5e6f",
    },
    "state": "extra fields are fine",
}


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("HealthAnswer", {"status": "healthy", "uptime": 3, "agent": "idle"}, True),
        ("HealthAnswer", {"status": "healthy", "uptime": 3}, False),
        ("HealthAnswer", {"status": "sick", "uptime": 3, "agent": "idle"}, False),
        ("StatusAnswer", {**STATUS, "agent": {**STATUS["agent"], "state": "busy"}}, False),
        ("StatusAnswer", STATUS, True),
        (
            "StatusAnswer",
            {**STATUS, "status": "unknown", "current_task": None, "cli_pid": None},
            True,
        ),
        ("StatusAnswer", {**STATUS, "cli_state": "RUNNING"}, False),
        ("StatusAnswer", {k: v for k, v in STATUS.items() if k != "warnings"}, False),
        ("MessageList", {"messages": [MESSAGE], "warnings": [], "truncated": False}, True),
        # A hand-written file's odd message is passed through, not hidden.
        (
            "MessageList",
            {
                "messages": [{**MESSAGE, "type": "chat", "from": None}],
                "warnings": [],
                "truncated": True,
            },
            True,
        ),
        (
            "MessageList",
            {
                "messages": [{k: v for k, v in MESSAGE.items() if k != "id"}],
                "warnings": [],
                "truncated": False,
            },
            False,
        ),
        ("NewMessage", {"from": "envoy", "type": "directive", "content": "stop"}, True),
        ("NewMessage", {"from": "e", "type": "task", "content": "x", "to": "s1"}, True),
        ("NewMessage", {"from": "e", "type": "task", "content": "x", "to": None}, False),
        ("NewMessage", {"from": "e", "type": "task", "content": "x", "id": "forged"}, False),
        ("NewMessage", {"type": "task", "content": "x"}, False),
        ("NewMessage", {"from": "e", "type": "chat", "content": "x"}, False),
        ("NewMessage", {"from": "a\nb", "type": "task", "content": "x"}, False),
        ("MessageCreated", {"id": "m-2", "timestamp": "2026-11-22T07:00:00Z"}, True),
        ("AckRequest", {"ids": ["m-1", "m-2"]}, True),
        ("AckRequest", {"ids": [1]}, False),
        ("AckRequest", {"ids": ["a"], "extra": 1}, False),
        ("AckResult", {"removed": 1, "unknown": 1}, True),
        ("BudgetRequest", {"usd": 2.5, "tokens": None}, True),
        ("BudgetRequest", {}, True),
        ("BudgetRequest", {"usd": 0}, False),
        ("BudgetRequest", {"usd": "1"}, False),
        ("BudgetRequest", {"tokens": 1.5}, False),
        ("BudgetRequest", {"euros": 1}, False),
        ("ResleeveRequest", {}, True),
        ("ResleeveRequest", {"cli": "shell"}, True),
        ("ResleeveRequest", {"cli": "nope"}, False),
        ("ResleeveRequest", {"cli": None}, False),
        ("ResleeveAccepted", {"status": "resleeving", "cli": "shell"}, True),
        ("Error", {"error": "unknown CLI 'x'"}, True),
        ("Event", {"type": "heartbeat", "time": "2026-11-22T07:00:00.000Z"}, True),
        (
            "Event",
            {"type": "cli-exit", "time": "t", "exit_code": 1, "cli": "shell", "pid": 7},
            True,
        ),
        ("Event", {"type": "cli-exit", "time": "t", "cli": "shell"}, False),
        ("Event", {"type": "bogus", "time": "t"}, False),
        (
            "Event",
            {
                "type": "agent-state",
                "time": "t",
                "state": "idle",
                "previous": "working",
                "reason": None,
            },
            True,
        ),
        ("Event", {"type": "inbox-notified", "time": "t", "ids": ["m"], "text": "x"}, True),
        ("InputRequest", {"text": "hello", "submit": False}, True),
        ("InputRequest", {"keys": ["Down", "Enter"], "if_state": ["waiting"]}, True),
        ("InputRequest", {"text": "a", "keys": ["Enter"]}, False),
        ("InputRequest", {"keys": ["Enter"], "submit": True}, False),
        ("InputRequest", {}, False),
        ("InputRequest", {"keys": ["Enter; kill-server"]}, False),
        ("InputRequest", {"text": "a\u001b[A"}, False),
        (
            "InputAccepted",
            {"delivered": True, "agent": "working", "held": 0.7, "changed": True},
            True,
        ),
        (
            "ScreenAnswer",
            {"rows": 2, "cols": 80, "lines": ["日本 e\u0301", ""], "cursor": {"row": 1, "col": 0}},
            True,
        ),
        (
            "ScreenAnswer",
            {"rows": 2, "cols": 80, "lines": [], "cursor": {"row": -1, "col": 0}},
            False,
        ),
        ("ScreenAnswer", {"rows": 2, "cols": 80, "lines": []}, False),
        ("InputRequest", {"choice": "Yes, I trust this folder"}, True),
        ("InputRequest", {"choice": "y", "keys": ["y"]}, False),
        ("InputRequest", {"choice": "y", "submit": True}, False),
        ("InputRequest", {"choice": ""}, False),
        ("ScreenSizeRequest", {"cols": 120, "rows": 40}, True),
        ("ScreenSizeRequest", {"cols": 0, "rows": 40}, False),
        ("ScreenSizeRequest", {"cols": 120}, False),
        ("ScreenSize", {"cols": 120, "rows": 40}, True),
        ("Event", {"type": "screen-resized", "time": "t", "cols": 120, "rows": 40}, True),
        (
            "AgentInfo",
            {
                "state": "waiting",
                "since": "t",
                "reason": "Do you want to proceed?",
                "source": "hooks",
                "session_id": None,
                "choices": [{"label": "Yes", "decision": "allow", "remember": False}],
            },
            True,
        ),
    ],
)
def test_contract_payloads_conform(
    spec: dict[str, Any], name: str, value: dict[str, Any], ok: bool
) -> None:
    assert conforms(spec, name, copy.deepcopy(value)) is ok
