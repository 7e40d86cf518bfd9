"""The message routes over real HTTP (aiohttp TestServer on 127.0.0.1, real files)."""

from __future__ import annotations

import io
import json
import pathlib
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from sidecar.core.contract import MAX_BODY_BYTES
from sidecar.workspace import mailbox
from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import Message, render_messages
from tests.harness import message_client

Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client(tmp_path: pathlib.Path) -> AsyncIterator[Client]:
    async with message_client(tmp_path) as c:
        yield c


def outbox(tmp_path: pathlib.Path) -> Mailbox:
    return Mailbox(tmp_path, "outbox")


def m(ident: str, body: str = "hi") -> Message:
    return Message(id=ident, sender="cli", type="milestone", time="2026-01-21T10:00:00Z", body=body)


async def test_empty_workspace_answers_empty_lists(client: Client) -> None:
    for route in ("/outbox", "/inbox"):
        resp = await client.get(route)
        assert resp.status == 200
        assert await resp.json() == {"messages": [], "warnings": [], "truncated": False}


async def test_post_inbox_fills_id_and_time_and_the_message_is_listed(client: Client) -> None:
    resp = await client.post(
        "/inbox",
        json={"from": "envoy", "type": "directive", "content": "---\nDo it.\n", "thread": "t1"},
    )
    assert resp.status == 201
    created = await resp.json()
    assert re.fullmatch(r"msg-[0-9a-f]{12}", created["id"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created["timestamp"])
    listed = await (await client.get("/inbox")).json()
    assert listed["messages"] == [
        {
            "id": created["id"],
            "from": "envoy",
            "to": None,
            "thread": "t1",
            "type": "directive",
            "content": "---\nDo it.\n",
            "timestamp": created["timestamp"],
        }
    ]


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "not valid JSON"),
        (b"[1, 2]", 400, "Expected `object`, got `array`"),
        (b'"text"', 400, "Expected `object`, got `str`"),
        (b'{"type": "task", "content": "x"}', 400, "missing required field `from`"),
        (b'{"from": "", "type": "task", "content": "x"}', 400, "`$.from`"),
        (b'{"from": "a\\nb", "type": "task", "content": "x"}', 400, "`from` must be one line"),
        (
            b'{"from": "e", "type": "gossip", "content": "x"}',
            400,
            "`$.type`; one of: blocked, directive,",
        ),
        (b'{"from": "e", "type": "task"}', 400, "missing required field `content`"),
        (b'{"from": "e", "type": "task", "content": 5}', 400, "`$.content`"),
        (b'{"from": "e", "type": "task", "content": "\\ud800"}', 400, "surrogate"),
        (b'{"from": "e", "type": "task", "content": "x", "to": 7}', 400, "`$.to`"),
        (b'{"from": "e", "type": "task", "content": "x", "to": null}', 400, "`$.to`"),
        (
            b'{"from": "e", "type": "task", "content": "x", "extra": 1}',
            400,
            "unknown field `extra`",
        ),
        (b'{"from": "  ", "type": "task", "content": "x"}', 400, "`from` must be one line"),
    ],
)
async def test_bad_post_inbox_bodies_get_a_json_error_and_write_nothing(
    client: Client, tmp_path: pathlib.Path, body: bytes, status: int, error: str
) -> None:
    resp = await client.post("/inbox", data=body)
    assert resp.status == status
    assert error in (await resp.json())["error"]
    assert not (tmp_path / ".needlecast").exists()


async def test_one_megabyte_content_is_413_past_the_documented_limit(
    client: Client, tmp_path: pathlib.Path
) -> None:
    content = "x" * (1024 * 1024)
    body = json.dumps({"from": "e", "type": "task", "content": content}).encode()
    resp = await client.post("/inbox", data=io.BytesIO(body))
    assert resp.status == 413
    assert str(MAX_BODY_BYTES) in (await resp.json())["error"]
    assert not (tmp_path / ".needlecast").exists()


async def test_chunked_body_without_length_is_cut_off_at_the_limit(client: Client) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"from": "e", "type": "task", "content": "'
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"y" * 65536
        yield b'"}'

    resp = await client.post("/inbox", data=chunks())
    assert resp.status == 413


async def test_content_just_under_the_limit_is_accepted(client: Client) -> None:
    content = "z" * (MAX_BODY_BYTES - 100)
    resp = await client.post("/inbox", json={"from": "e", "type": "task", "content": content})
    assert resp.status == 201
    listed = await (await client.get("/inbox")).json()
    assert listed["messages"][0]["content"] == content


async def test_ack_removes_exactly_those_ids_and_counts_unknown_ones(
    client: Client, tmp_path: pathlib.Path
) -> None:
    box = outbox(tmp_path)
    for ident in ("a", "b", "c"):
        box.append(m(ident))
    seen = [x["id"] for x in (await (await client.get("/outbox")).json())["messages"]]
    box.append(m("d"))  # appended between the GET and the ack: must stay
    resp = await client.post("/outbox/ack", json={"ids": [*seen[:2], "zzz", "a"]})
    assert resp.status == 200
    assert await resp.json() == {"removed": 2, "unknown": 1}
    left = await (await client.get("/outbox")).json()
    assert [x["id"] for x in left["messages"]] == ["c", "d"]


@pytest.mark.parametrize(
    "body", [b"nope", b"[]", b'{"ids": "a"}', b'{"ids": [1]}', b'{"id": ["a"]}']
)
async def test_bad_ack_bodies_are_400(client: Client, body: bytes) -> None:
    resp = await client.post("/outbox/ack", data=body)
    assert resp.status == 400
    assert "error" in await resp.json()


async def test_broken_outbox_is_listed_with_warnings_not_a_500(
    client: Client, tmp_path: pathlib.Path
) -> None:
    (tmp_path / ".needlecast").mkdir()
    bad = "---\nid: x\nfrom: [oops\n---\nbody\n\n"
    text = render_messages([m("a")]) + bad + render_messages([m("b")])
    (tmp_path / ".needlecast" / "outbox.md").write_text(text)
    data = await (await client.get("/outbox")).json()
    assert [x["id"] for x in data["messages"]] == ["a", "b"]
    assert len(data["warnings"]) == 1
    assert data["warnings"][0].startswith("line ")


async def test_twenty_megabyte_outbox_answers_whole_messages_up_to_the_limit(
    client: Client, tmp_path: pathlib.Path
) -> None:
    (tmp_path / ".needlecast").mkdir()
    path = tmp_path / ".needlecast" / "outbox.md"
    path.write_text(render_messages([m(f"m{i}", "q" * 2000) for i in range(10_000)]))
    assert path.stat().st_size > 20_000_000
    resp = await client.get("/outbox")
    assert resp.status == 200
    data = await resp.json()
    assert data["truncated"] is True
    assert any("ack them to see the rest" in w for w in data["warnings"])
    assert 0 < len(data["messages"]) < 10_000
    assert all(x["content"] == "q" * 2000 for x in data["messages"])


async def test_full_inbox_is_507_with_a_clear_error(client: Client, tmp_path: pathlib.Path) -> None:
    (tmp_path / ".needlecast").mkdir()
    with open(tmp_path / ".needlecast" / "inbox.md", "wb") as f:
        f.truncate(mailbox.MAX_FILE_BYTES)  # sparse: costs no disk
    resp = await client.post("/inbox", json={"from": "e", "type": "task", "content": "x"})
    assert resp.status == 507
    assert "limit" in (await resp.json())["error"]


async def test_needlecast_symlinked_outside_the_workspace_is_refused(
    tmp_path: pathlib.Path,
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (workspace / ".needlecast").symlink_to(outside)
    async with message_client(workspace) as c:
        resp = await c.post("/inbox", json={"from": "e", "type": "task", "content": "x"})
        assert resp.status == 409
        assert "outside the workspace" in (await resp.json())["error"]
        resp = await c.get("/outbox")
        assert resp.status == 409
        resp = await c.post("/outbox/ack", json={"ids": ["a"]})
        assert resp.status == 409
    assert list(outside.iterdir()) == []


async def test_a_workspace_that_refuses_the_message_file_is_409_not_500(
    client: Client, tmp_path: pathlib.Path
) -> None:
    """`.needlecast` a file where the folder belongs (a user's workspace, as found): the
    workspace's state, answered 409 naming it, never 500; nothing of the user's is touched."""
    (tmp_path / ".needlecast").write_text("not a folder")
    resp = await client.post("/inbox", json={"from": "e", "type": "task", "content": "x"})
    assert resp.status == 409, await resp.text()
    assert "the workspace refuses it" in (await resp.json())["error"]
    assert (tmp_path / ".needlecast").read_text() == "not a folder"
    for path in ("/inbox", "/outbox"):
        assert (await client.get(path)).status in (200, 409)
