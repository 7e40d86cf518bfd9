"""A recording's file, written by the real recorder into a real directory and read back: valid
asciicast v2 whatever the pane wrote (invalid UTF-8, wide and combining characters, a clear-screen
loop, a secret cut across chunks), cut with a marker at the size cap, the oldest recordings removed
first, a full disk leaves a valid file, and a writer killed mid-recording leaves a file valid up to
its last complete event."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sidecar.api.recordings import complete_size
from sidecar.record import asciicast
from sidecar.record.recording import Recording
from sidecar.record.redact import MASK, Redactor, env_secrets
from sidecar.record.store import NoRecording, RecordStore
from tests.harness import REPO, wait_for, wait_for_async
from tests.recordtools import markers, recording_lines

SECRET = "sk-test-0123456789abcdefghij"


def start(store: RecordStore, secrets: tuple[str, ...] = ()) -> Recording:
    store.prepare()
    return Recording.start(store, cli="toy", sleeve="s1", size=(80, 24), secrets=secrets)


async def finish(recording: Recording, label: str | None = "done") -> Path:
    recording.end(label)
    assert await recording.closed(5)
    return recording.store.path(recording.id)


def output_text(path: Path) -> str:
    return "".join(e[2] for e in recording_lines(path)[1:] if e[1] == "o")


async def test_every_line_is_asciicast_v2_whatever_the_pane_wrote(tmp_path: Path) -> None:
    """Invalid UTF-8 becomes U+FFFD; a character cut between two chunks, wide (CJK, emoji) and
    combining characters come through whole; a clear-screen loop is a run of events; the header
    names the CLI and the size; event times never go back."""
    rec = start(RecordStore(tmp_path, 10 * 1024 * 1024))
    wide = "漢字 🙂 e\u0301 ä"
    raw = wide.encode()
    rec.output(b"bad \xff\xfe bytes\r\n")
    rec.output(raw[:4])  # inside the second character's three bytes
    rec.output(raw[4:])
    for _ in range(200):
        rec.output(b"\x1b[2J\x1b[H frame")
    rec.marker("a marker\nwith a newline")
    path = await finish(rec)
    lines = recording_lines(path)
    header = lines[0]
    assert (header["version"], header["width"], header["height"]) == (2, 80, 24)
    assert header["sleeve"] == {"id": "s1", "cli": "toy"}
    times = [e[0] for e in lines[1:]]
    assert times == sorted(times)
    text = output_text(path)
    assert "bad \ufffd\ufffd bytes" in text
    assert wide in text
    assert text.count("\x1b[2J") == 200
    assert markers(path) == ["a marker with a newline", "done"]


async def test_secrets_are_masked_before_a_byte_is_written_even_across_chunks(
    tmp_path: Path,
) -> None:
    rec = start(RecordStore(tmp_path, 1024 * 1024), secrets=(SECRET, "short"))
    rec.output(f"key={SECRET[:7]}".encode())
    rec.output(f"{SECRET[7:]} and again {SECRET}\r\n".encode())
    rec.output(f"at the very end {SECRET[:10]}".encode())  # never completed: written at the end
    rec.marker(f"a command with {SECRET}")
    path = await finish(rec)
    raw = path.read_text()
    assert SECRET not in raw
    text = output_text(path)
    assert text.startswith(f"key={MASK} and again {MASK}")
    assert text.endswith(f"at the very end {SECRET[:10]}")
    assert markers(path)[0] == f"a command with {MASK}"
    assert "short" not in Redactor(["short"]).text("x") and Redactor(["short"]).active is False


def test_secret_variables_are_known_by_their_names() -> None:
    env = {"ANTHROPIC_API_KEY": "k1", "GH_TOKEN": "t", "DB_PASSWORD": "p", "PATH": "/bin"}
    assert sorted(env_secrets(env)) == ["k1", "p", "t"]


async def test_the_cap_holds_and_the_recording_ends_with_a_marker_saying_it_was_cut(
    tmp_path: Path,
) -> None:
    store = RecordStore(tmp_path, 64 * 1024)
    rec = start(store)
    for _ in range(2000):
        rec.output(b"x" * 100 + b"\r\n")
    assert rec.cut
    path = await finish(rec, "exited")
    assert path.stat().st_size <= 64 * 1024
    assert markers(path)[-1].startswith("recording cut: SIDECAR_RECORD_MAX_MB")
    assert "exited" not in markers(path)  # nothing after the cut


async def test_the_oldest_recordings_go_first_and_the_live_one_never(tmp_path: Path) -> None:
    store = RecordStore(tmp_path, 100 * 1024)
    old = [await finish(fill(start(store), 30 * 1024)) for _ in range(3)]
    live = start(store)
    fill(live, 50 * 1024)  # 3 x 30 + 50 > 100: the oldest two must go, the newest stays
    assert [p.exists() for p in old] == [False, False, True]
    assert not live.cut
    path = await finish(live)
    items = store.items(None)
    assert [i.id for i in items] == [old[2].stem, path.stem]
    assert sum(i.bytes for i in items) <= 100 * 1024
    assert items[1].markers == 1 and items[1].cli == "toy" and items[1].ended is not None
    with pytest.raises(NoRecording):
        store.path("../../etc/passwd")


def fill(rec: Recording, size: int) -> Recording:
    for _ in range(size // 1000):
        rec.output(b"y" * 998 + b"\r\n")
    return rec


async def test_a_full_disk_stops_the_recording_and_leaves_it_valid(tmp_path: Path) -> None:
    """A real tmpfs of 256 KiB (mounting one needs root: skipped without it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], check=True)
    try:
        rec = start(RecordStore(disk / "recordings", 100 * 1024 * 1024))
        for _ in range(1000):
            rec.output(b"z" * 1000 + b"\r\n")
        await wait_for_async(lambda: rec.failed, 10, what="the disk to refuse")
        path = await finish(rec)
        for line in path.read_text().splitlines():
            json.loads(line)
        assert "No space left" in (rec.failed or "")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_writer_killed_mid_recording_leaves_a_file_valid_to_its_last_event(
    tmp_path: Path,
) -> None:
    """A child writes a recording as fast as it can and is SIGKILLed: every whole line there
    is a complete event (the kernel may have cut the line it was writing), and the recorder
    that takes the run over removes a cut line and goes on in the same file."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from sidecar.record.recording import Recording
        from sidecar.record.store import RecordStore
        store = RecordStore(Path({str(tmp_path)!r}), 1 << 30)
        store.prepare()
        rec = Recording.start(store, cli="toy", sleeve="s1", size=(80, 24), secrets=())
        print(rec.id, flush=True)
        n = 0
        while True:
            n += 1
            rec.output(("line %d " % n + "w" * 3000 + "\\r\\n").encode())
            if n % 100 == 0:
                rec.marker("hundred %d" % n)
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        rec_id = child.stdout.readline().strip()
        path = tmp_path / f"{rec_id}.cast"
        wait_for(lambda: path.exists() and path.stat().st_size > 2_000_000, 30)
        child.send_signal(signal.SIGKILL)
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    lines = whole.decode().splitlines()
    assert asciicast.read_header(data) is not None
    for line in lines[1:]:
        time, code, _ = json.loads(line)
        assert code in ("o", "m") and time >= 0
    resumed = Recording.resume(RecordStore(tmp_path, 1 << 30), rec_id, ())
    assert path.read_bytes() == whole
    assert resumed.markers == sum(1 for line in lines if ',"m",' in line)
    resumed.marker("taken over")
    asyncio.run(finish(resumed))
    assert markers(path)[-2:] == ["taken over", "done"]


def test_a_file_is_served_up_to_its_last_whole_line_however_long_its_cut_line(
    tmp_path: Path,
) -> None:
    """`GET /recordings/{id}` serves a recording that is being written up to its last whole
    line, found back from the end even when the line being written is longer than a read."""
    path = tmp_path / "r.cast"
    whole = b'{"version": 2}\n[0.1, "o", "' + b"x" * 3_000_000 + b'"]\n'
    path.write_bytes(whole + b'[0.2, "o", "' + b"y" * 3_000_000)
    with path.open("rb") as fh:
        assert complete_size(fh.fileno()) == len(whole)
    path.write_bytes(b'{"vers')
    with path.open("rb") as fh:
        assert complete_size(fh.fileno()) == 0
