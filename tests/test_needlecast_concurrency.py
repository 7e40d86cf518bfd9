"""No loss under concurrency and no torn file after kill -9: real writer processes, real HTTP."""

from __future__ import annotations

import asyncio
import collections
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import Message, render_message, render_messages
from tests.harness import NEEDLECAST_WRITER, REPO, message_client, wait_for
from tests.needlecast_writer import BIG_BODY, body_for

TIME = "2026-01-21T10:00:00Z"


@pytest.fixture
async def client(tmp_path: pathlib.Path) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with message_client(tmp_path) as c:
        yield c


async def start_writers(
    workspace: pathlib.Path, name: str, writers: int, count: int
) -> list[asyncio.subprocess.Process]:
    return [
        await asyncio.create_subprocess_exec(
            sys.executable,
            NEEDLECAST_WRITER,
            "append",
            str(workspace),
            name,
            str(w),
            str(count),
            stdout=asyncio.subprocess.PIPE,
            cwd=REPO,
        )
        for w in range(writers)
    ]


async def test_four_writer_processes_and_an_acking_reader_lose_and_duplicate_nothing(
    tmp_path: pathlib.Path, client: TestClient[web.Request, web.Application]
) -> None:
    writers, count = 4, 2500
    procs = await start_writers(tmp_path, "outbox", writers, count)
    waits = [asyncio.ensure_future(p.communicate()) for p in procs]
    seen: collections.Counter[str] = collections.Counter()
    removed = 0
    deadline = time.monotonic() + 100
    while True:
        assert time.monotonic() < deadline, f"only {len(seen)} messages seen"
        writers_done = all(w.done() for w in waits)  # read before the GET: nothing comes later
        resp = await client.get("/outbox")
        assert resp.status == 200
        data = await resp.json()
        assert data["warnings"] == []
        batch = data["messages"]
        for m in batch:
            assert m["content"] == body_for(m["id"]), m["id"]
        seen.update(m["id"] for m in batch)
        if batch:
            ack = await client.post("/outbox/ack", json={"ids": [m["id"] for m in batch]})
            assert ack.status == 200
            answer = await ack.json()
            assert answer == {"removed": len(batch), "unknown": 0}
            removed += answer["removed"]
        elif writers_done:
            break
        else:
            await asyncio.wait(waits, timeout=0.005)  # poll: let the writers get ahead a little
    outs = [await w for w in waits]
    assert [p.returncode for p in procs] == [0] * writers
    assert all(out == b"done\n" for out, _ in outs)
    expected = {f"w{w}-{i:05d}" for w in range(writers) for i in range(count)}
    assert set(seen) == expected
    assert max(seen.values()) == 1  # acked exactly once, never served twice
    assert removed == writers * count
    assert (tmp_path / ".needlecast" / "outbox.md").read_bytes() == b""


async def test_concurrent_inbox_posts_and_writer_processes_lose_nothing(
    tmp_path: pathlib.Path, client: TestClient[web.Request, web.Application]
) -> None:
    procs = await start_writers(tmp_path, "inbox", 2, 500)
    gate = asyncio.Semaphore(50)

    async def post(i: int) -> str:
        async with gate:
            resp = await client.post(
                "/inbox",
                json={"from": "envoy", "type": "task", "content": body_for(f"post-{i}")},
            )
            assert resp.status == 201
            return str((await resp.json())["id"])

    posted = await asyncio.gather(*(post(i) for i in range(1000)))
    for p in procs:
        await p.communicate()
        assert p.returncode == 0
    data = await (await client.get("/inbox")).json()
    assert data["warnings"] == []
    ids = [m["id"] for m in data["messages"]]
    assert len(ids) == len(set(ids)) == 2000
    assert set(posted) | {f"w{w}-{i:05d}" for w in range(2) for i in range(500)} == set(ids)
    by_id = {m["id"]: m["content"] for m in data["messages"]}
    assert sorted(by_id[i] for i in posted) == sorted(body_for(f"post-{i}") for i in range(1000))


def outbox_with(workspace: pathlib.Path, messages: list[Message]) -> pathlib.Path:
    path = workspace / ".needlecast" / "outbox.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(render_messages(messages))
    return path


def numbered(n: int, body: str = "body") -> list[Message]:
    return [
        Message(
            id=f"m{i:05d}", sender="cli", type="response", time="2026-01-21T10:00:00Z", body=body
        )
        for i in range(n)
    ]


def test_kill_9_between_temp_file_and_rename_leaves_the_old_file_whole(
    tmp_path: pathlib.Path,
) -> None:
    messages = numbered(200)
    path = outbox_with(tmp_path, messages)
    before = path.read_bytes()
    child = subprocess.Popen(
        [sys.executable, NEEDLECAST_WRITER, "rewrite-pause", str(tmp_path), "m00005"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"paused\n"  # mid-rewrite: temp written, not renamed
        temps = [p.name for p in path.parent.iterdir() if ".tmp-" in p.name]
        assert len(temps) == 1
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            assert stream is not None
            stream.close()
    assert child.returncode == -signal.SIGKILL
    assert path.read_bytes() == before
    box = Mailbox(tmp_path, "outbox")
    assert list(box.read().messages) == messages
    assert box.remove(["m00005"]).removed == 1  # the next writer also sweeps the stale temp
    assert [p.name for p in path.parent.iterdir() if ".tmp-" in p.name] == []
    assert path.read_text() == render_messages(messages[:5] + messages[6:])


def test_kill_9_at_a_random_moment_of_rewrites_leaves_an_old_or_new_version(
    tmp_path: pathlib.Path,
) -> None:
    messages = numbered(1500, "lorem ipsum\n" * 20)
    rendered = [render_message(m).encode() for m in messages]
    for _ in range(3):
        path = outbox_with(tmp_path, messages)
        inode = path.stat().st_ino
        child = subprocess.Popen(
            [sys.executable, NEEDLECAST_WRITER, "rewrite-loop", str(tmp_path)], cwd=REPO
        )
        wait_for(  # the first rewrite landed: now it is busy rewriting
            lambda p=path, i=inode, c=child: p.stat().st_ino != i or c.poll() is not None,
            30,
            interval=0,
            what="the first rewrite",
        )
        assert child.poll() is None
        child.send_signal(signal.SIGKILL)
        child.wait()
        data = path.read_bytes()
        # Old or new means: exactly the original minus its first k messages, for some k.
        k = len(messages) - len(Mailbox(tmp_path, "outbox").read().messages)
        assert data == b"".join(rendered[k:])


def test_kill_9_during_big_appends_never_shows_a_torn_message(tmp_path: pathlib.Path) -> None:
    (tmp_path / ".needlecast").mkdir()
    path = tmp_path / ".needlecast" / "outbox.md"
    box = Mailbox(tmp_path, "outbox")
    journal = tmp_path / ".needlecast" / ".outbox.md.lock"
    killed_mid_append = 0
    for _ in range(5):
        path.write_bytes(b"")
        child = subprocess.Popen(
            [sys.executable, NEEDLECAST_WRITER, "append-big", str(tmp_path), "8"], cwd=REPO
        )
        wait_for(
            lambda c=child: path.stat().st_size >= 1_500_000 or c.poll() is not None,
            30,
            interval=0,
            what="1.5 MB appended",
        )
        child.send_signal(signal.SIGKILL)
        child.wait()
        killed_mid_append += journal.read_bytes() != b""  # the writer died inside append()
        result = box.read()
        assert result.warnings == ()
        assert [m.id for m in result.messages] == [f"big-{i}" for i in range(len(result.messages))]
        assert all(m.body == BIG_BODY for m in result.messages)
        box.append(Message(id="after", sender="x", type="task", time=None, body="ok"))
        after = box.read()
        assert [m.id for m in after.messages][-1] == "after"
        assert len(after.messages) == len(result.messages) + 1
        assert os.path.getsize(path) == len(render_messages(after.messages).encode())
    assert killed_mid_append  # the kills did land inside appends (about 9 in 10 do)
