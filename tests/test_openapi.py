"""The OpenAPI document (sidecar.openapi): valid, complete for the contract, serialisable."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

from sidecar.openapi import openapi_spec

CLIS = ["claude-code", "codex", "gemini-cli", "opencode", "shell"]
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
}


@pytest.fixture
def spec() -> dict[str, Any]:
    return openapi_spec(cli_names=CLIS)


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


def deref(spec: dict[str, Any], node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = resolve(spec, node["$ref"])
    return node


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


# A small validator for the JSON Schema subset the document uses; enough to prove that the
# payloads CONTRACT.md shows are accepted and obvious mistakes are not.
def conforms(spec: dict[str, Any], schema: dict[str, Any], value: Any) -> bool:
    schema = deref(spec, schema)
    if value is None:
        return bool(schema.get("nullable"))
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    checks = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    if kind is not None and not checks[kind](value):
        return False
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if kind == "array":
        return all(conforms(spec, schema.get("items", {}), item) for item in value)
    if kind == "object":
        props = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(conforms(spec, props[k], v) for k, v in value.items() if k in props)
    return True


def schema(spec: dict[str, Any], name: str) -> dict[str, Any]:
    result: dict[str, Any] = spec["components"]["schemas"][name]
    return result


# --- validity ---------------------------------------------------------------------------------


def test_validates_with_openapi_spec_validator(spec: dict[str, Any]) -> None:
    import openapi_spec_validator as validator

    validator.validate(spec)
    validator.validate(openapi_spec(cli_names=[]))


def test_structure_is_sound(spec: dict[str, Any]) -> None:
    """The checks a validator would make, for machines where none is installed."""
    assert spec["openapi"].startswith("3.0.")
    assert spec["info"]["title"]
    assert spec["info"]["version"]
    assert spec["paths"]
    for path, item in spec["paths"].items():
        assert path.startswith("/")
        assert set(item) & METHODS, f"{path} has no operation"
    ids = [op["operationId"] for _, _, op in operations(spec)]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    for path, method, op in operations(spec):
        assert op["responses"], f"{method} {path} has no responses"
        for code, response in op["responses"].items():
            assert code == "default" or (code.isdigit() and 100 <= int(code) <= 599)
            assert deref(spec, response)["description"], f"{method} {path} {code}"
        body = op.get("requestBody")
        if body is not None:
            assert body["content"]


def test_every_ref_resolves_and_every_schema_is_used(spec: dict[str, Any]) -> None:
    used = set()
    for ref in refs(spec):
        resolve(spec, ref)
        used.add(ref)
    for kind in ("schemas", "responses"):
        for name in spec["components"][kind]:
            assert f"#/components/{kind}/{name}" in used, f"unused {kind[:-1]} {name}"


def test_schemas_are_consistent(spec: dict[str, Any]) -> None:
    for name, item in spec["components"]["schemas"].items():
        props = item.get("properties", {})
        missing = set(item.get("required", [])) - set(props)
        assert not missing, f"{name} requires undeclared {missing}"
        for prop in props.values():
            if "enum" in prop:
                assert prop["enum"], f"{name}: empty enum"


def test_security_schemes_exist_and_health_is_public(spec: dict[str, Any]) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearer"] == {**schemes["bearer"], "type": "http", "scheme": "bearer"}
    for requirement in spec["security"]:
        assert set(requirement) <= set(schemes)
    for path, _, op in operations(spec):
        if path == "/health":
            assert op["security"] == []
        else:
            assert "security" not in op, f"{path} must inherit the token requirement"
    text = spec["info"]["description"]
    assert "SIDECAR_TOKEN" in text
    assert "SIDECAR_VIEW_TOKEN" in text


def test_json_serialisable_and_fresh_each_call(spec: dict[str, Any]) -> None:
    assert json.loads(json.dumps(spec)) == spec
    again = openapi_spec(cli_names=CLIS)
    again["components"]["schemas"]["Status"]["required"].clear()
    assert openapi_spec(cli_names=CLIS) == spec


# --- completeness -----------------------------------------------------------------------------


def test_every_contract_route_is_described(spec: dict[str, Any]) -> None:
    for path, methods in CONTRACT_ROUTES.items():
        assert path in spec["paths"], path
        assert methods <= set(spec["paths"][path]), path


def test_resleeve_enum_is_the_cli_names() -> None:
    names = ["alpha", "my-cli", "shell"]
    spec = openapi_spec(cli_names=names)
    assert schema(spec, "ResleeveRequest")["properties"]["cli"]["enum"] == names
    body = spec["paths"]["/resleeve"]["post"]["requestBody"]
    assert body["required"] is False
    # No CLIs known: no enum at all (an empty enum would accept nothing).
    empty = openapi_spec(cli_names=[])
    assert "enum" not in schema(empty, "ResleeveRequest")["properties"]["cli"]


def test_media_types(spec: dict[str, Any]) -> None:
    paths = spec["paths"]
    assert "application/x-ndjson" in paths["/events"]["get"]["responses"]["200"]["content"]
    assert "text/html" in paths["/"]["get"]["responses"]["200"]["content"]
    assert "text/html" in paths["/terminal"]["get"]["responses"]["200"]["content"]
    assert "101" in paths["/terminal/ws"]["get"]["responses"]
    assert "tty" in paths["/terminal"]["get"]["description"]


def test_error_answers_use_the_error_schema(spec: dict[str, Any]) -> None:
    expected = {
        ("/resleeve", "post"): {"400", "401", "403", "409", "413"},
        ("/inbox", "post"): {"400", "401", "403", "413"},
        ("/outbox/ack", "post"): {"400", "401", "403", "413"},
        ("/status", "get"): {"401"},
        ("/terminal/ws", "get"): {"401", "503"},
    }
    for (path, method), codes in expected.items():
        responses = spec["paths"][path][method]["responses"]
        assert codes <= set(responses), (path, method)
    for path, _, op in operations(spec):
        for code, response in op["responses"].items():
            if code == "default" or int(code) >= 400:
                content = deref(spec, response)["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (path, code)


def test_answers_allow_additions_and_new_message_does_not(spec: dict[str, Any]) -> None:
    requests = {"NewMessage", "AckRequest", "ResleeveRequest"}
    for name, item in spec["components"]["schemas"].items():
        if item.get("type") == "object":
            assert item["additionalProperties"] is (name not in requests), name


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
    "cli": "claude-code",
    "cli_pid": 42,
    "cli_running": True,
    "last_activity": None,
    "health": "healthy",
    "repo": None,
    "warnings": [],
    "cli_state": "RUNNING",
    "state": "extra fields are fine",
}


@pytest.mark.parametrize(
    ("name", "value", "ok"),
    [
        ("Health", {"status": "healthy", "uptime": 3}, True),
        ("Health", {"status": "sick", "uptime": 3}, False),
        ("Status", STATUS, True),
        ("Status", {**STATUS, "status": "unknown", "current_task": None, "cli_pid": None}, True),
        ("Status", {k: v for k, v in STATUS.items() if k != "warnings"}, False),
        ("MessageList", {"messages": [MESSAGE], "warnings": []}, True),
        # A hand-written file's odd message is passed through, not hidden.
        ("MessageList", {"messages": [{**MESSAGE, "type": "chat", "from": None}]}, True),
        ("MessageList", {"messages": [{k: v for k, v in MESSAGE.items() if k != "id"}]}, False),
        ("MessageList", {"messages": [MESSAGE], "warnings": [], "truncated": False}, True),
        ("NewMessage", {"from": "envoy", "type": "directive", "content": "stop"}, True),
        ("NewMessage", {"from": "e", "type": "task", "content": "x", "to": "s1"}, True),
        ("NewMessage", {"from": "e", "type": "task", "content": "x", "id": "forged"}, False),
        ("NewMessage", {"type": "task", "content": "x"}, False),
        ("NewMessage", {"from": "e", "type": "chat", "content": "x"}, False),
        ("MessageCreated", {"id": "m-2", "timestamp": "2026-11-22T07:00:00Z"}, True),
        ("AckRequest", {"ids": ["m-1", "m-2"]}, True),
        ("AckRequest", {"ids": [1]}, False),
        ("AckResult", {"removed": 2}, True),
        ("AckResult", {"removed": 1, "unknown": 1}, True),
        ("ResleeveRequest", {}, True),
        ("ResleeveRequest", {"cli": "shell"}, True),
        ("ResleeveRequest", {"cli": "nope"}, False),
        ("ResleeveAccepted", {"status": "resleeving", "cli": "shell"}, True),
        ("Error", {"error": "unknown CLI 'x'"}, True),
        ("Event", {"type": "heartbeat", "time": "2026-11-22T07:00:00.000Z"}, True),
        ("Event", {"type": "cli-exit", "time": "t", "exit_code": 1, "cli": "shell"}, True),
        ("Event", {"type": "bogus", "time": "t"}, False),
    ],
)
def test_contract_payloads_conform(
    spec: dict[str, Any], name: str, value: dict[str, Any], ok: bool
) -> None:
    assert conforms(spec, schema(spec, name), copy.deepcopy(value)) is ok
