"""The running sidecar checked against its own /openapi.json, for the contract's own examples and
known bad bodies: every answer's status is documented for its route, and every JSON body
validates against the documented schema. (Generated requests: test_fuzz_openapi.py.)"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openapi_schema_validator import OAS31Validator

from tests.harness import Sidecar

TOKEN = "contract-token-0123456789"


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[Sidecar, dict[str, Any]]]:
    base = Path(tempfile.mkdtemp(prefix="sc-"))
    sc = Sidecar(base, env_extra={"SIDECAR_TOKEN": TOKEN, "SLEEVE_GOAL": "contract"})
    try:
        sc.start()
        code, spec = sc.get("/openapi.json")
        assert code == 200
        yield sc, spec
    finally:
        sc.kill_everything()
        shutil.rmtree(base, ignore_errors=True)


def check(spec: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    operation = spec["paths"][path][method.lower()]
    responses = operation["responses"]
    documented = responses.get(str(status)) or responses.get("default")
    assert documented is not None, f"{method} {path} answered {status}, which is not documented"
    media = documented.get("content", {}).get("application/json")
    if media is None or isinstance(body, bytes):
        return
    # Local "#/components/..." references resolve against the root: put the components there.
    schema = {"allOf": [media["schema"]], "components": spec["components"]}
    OAS31Validator(schema).validate(body)


CASES: list[tuple[str, str, Any, dict[str, str] | None]] = [
    ("GET", "/health", None, None),
    ("GET", "/status", None, None),
    ("GET", "/outbox", None, None),
    ("GET", "/inbox", None, None),
    ("POST", "/inbox", {"from": "envoy", "type": "task", "content": "hello"}, None),
    ("POST", "/inbox", {"from": "envoy", "type": "gossip", "content": "x"}, None),
    ("POST", "/inbox", {"type": "task"}, None),
    ("POST", "/outbox/ack", {"ids": ["msg-unknown"]}, None),
    ("POST", "/outbox/ack", {"ids": "nope"}, None),
    ("POST", "/resleeve", {"cli": "no-such-cli"}, None),
    ("POST", "/resleeve", {"cli": 3}, None),
    ("GET", "/status", None, {}),  # no token: 401
    ("GET", "/status", None, {"Authorization": "Bearer wrong"}),
]


@pytest.mark.parametrize(("method", "path", "body", "headers"), CASES)
def test_answers_match_the_openapi_description(
    live: tuple[Sidecar, dict[str, Any]],
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str] | None,
) -> None:
    sc, spec = live
    if method == "GET":
        status, answer = sc.get(path, headers=headers)
    else:
        status, answer = sc.post(path, body, headers=headers)
    check(spec, method, path, status, answer)


def test_resleeve_answer_matches_the_description(live: tuple[Sidecar, dict[str, Any]]) -> None:
    sc, spec = live
    status, answer = sc.post("/resleeve", {"cli": "shell"})
    assert status == 202
    check(spec, "POST", "/resleeve", status, answer)
    sc.wait_status(lambda s: not s["resleeving"], "resleeve finished")


def test_every_documented_path_answers(live: tuple[Sidecar, dict[str, Any]]) -> None:
    sc, spec = live
    for path, item in spec["paths"].items():
        if "get" not in item or path in ("/events", "/terminal/ws"):
            continue  # a stream and a WebSocket: tested in test_api
        status, _ = sc.get(path)
        assert status < 500, path
        assert str(status) in item["get"]["responses"] or "default" in item["get"]["responses"], (
            path,
            status,
        )
