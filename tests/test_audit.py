"""The audit trail (`sidecar.audit`) on real files: records appended and fsync'd in batches,
acknowledged only once on disk, `seq` carried on across a restart, rotated by size, a line torn
by a crash skipped, read back by time, type and `seq`; and a disk that fills up (a real tmpfs of
a few KiB, mounted by the test) holding records in memory, bounded, until it takes them again."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from sidecar.audit import reader
from sidecar.audit.records import EgressChangedRecord, ResleeveRecord
from sidecar.audit.trail import NAME, AuditTrail
from tests.faulttools import fill, small_disk
from tests.harness import wait_for_async


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def resleeve(n: int) -> ResleeveRecord:
    return ResleeveRecord(previous="shell", cli=f"cli-{n}", pid=n)


async def test_records_are_acknowledged_once_on_disk_and_seq_goes_on(tmp_path: Path) -> None:
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    for n in range(5):
        trail.write(resleeve(n))
    assert await trail.synced() is True
    got = lines(tmp_path / NAME)
    assert [r["seq"] for r in got] == [1, 2, 3, 4, 5]
    assert got[0] == {"type": "resleeve", "previous": "shell", "cli": "cli-0", "pid": 0,
                      "seq": 1, "time": got[0]["time"], "sleeve": "s1"}  # fmt: skip
    assert (tmp_path / NAME).stat().st_mode & 0o777 == 0o600
    await trail.close()
    again = AuditTrail(tmp_path, "s1")  # a supervisor started again
    again.open()
    again.write(resleeve(9))
    assert await again.synced()
    await again.close()
    assert [r["seq"] for r in lines(tmp_path / NAME)] == [1, 2, 3, 4, 5, 6]


async def test_a_line_torn_by_a_crash_is_skipped_and_the_next_record_starts_its_own(
    tmp_path: Path,
) -> None:
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    trail.write(resleeve(1))
    await trail.synced()
    await trail.close()
    with open(tmp_path / NAME, "ab") as fh:  # what a kill in the middle of a write leaves
        fh.write(b'{"type":"resleeve","previous":"sh')
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    trail.write(resleeve(2))
    await trail.synced()
    await trail.close()
    found, truncated = reader.read(tmp_path, [], reader.Query())
    assert [json.loads(r)["cli"] for r in found] == ["cli-1", "cli-2"]
    assert truncated is False


async def test_the_trail_rotates_by_size_and_keeps_four_old_files(tmp_path: Path) -> None:
    trail = AuditTrail(tmp_path, "s1", max_bytes=2000)
    trail.open()
    for n in range(200):
        trail.write(resleeve(n))
        if n % 10 == 9:
            await trail.synced()
    await trail.synced()
    await trail.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [NAME, *(f"{NAME}.{n}" for n in range(1, 5))]
    assert all(p.stat().st_size < 2000 + 1500 for p in tmp_path.iterdir())
    found, _ = reader.read(tmp_path, [], reader.Query(limit=reader.MAX_LIMIT))
    seqs = [json.loads(r)["seq"] for r in found]
    assert seqs == sorted(seqs) and seqs[-1] == 200  # oldest first; the oldest files gone
    assert seqs[0] > 1


async def test_reading_back_by_time_type_and_seq(tmp_path: Path) -> None:
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    for n in range(6):
        trail.write(resleeve(n))
        trail.write(EgressChangedRecord(added=[f"h{n}.example"], removed=[], by="api",
                                        allow=[f"h{n}.example"]))  # fmt: skip
    await trail.synced()
    await trail.close()
    every, _ = reader.read(tmp_path, [], reader.Query(limit=100))
    times = [json.loads(r)["time"] for r in every]

    def ask(**kw: object) -> tuple[list[int], bool]:
        found, truncated = reader.read(tmp_path, [], reader.Query(**kw))  # type: ignore[arg-type]
        return [json.loads(r)["seq"] for r in found], truncated

    assert ask(types=frozenset({"egress-changed"}), limit=2) == ([10, 12], True)  # the latest
    assert ask(after=3, limit=4) == ([4, 5, 6, 7], True)  # paging on
    assert ask(after=10, limit=4) == ([11, 12], False)
    assert ask(since=times[7], limit=100)[0][0] <= 8
    assert ask(since="2999-01-01T00:00:00.000Z") == ([], False)


async def test_records_held_in_memory_are_read_back_once(tmp_path: Path) -> None:
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    trail.write(resleeve(1))
    await trail.synced()
    trail.write(resleeve(2))
    held = trail.held  # not on disk yet: the reader adds them after the files
    found, _ = reader.read(tmp_path, [*held, *held], reader.Query())
    assert [json.loads(r)["seq"] for r in found] == [1, 2]
    await trail.close()


async def test_a_full_disk_holds_records_in_memory_and_writes_them_when_it_can(
    tmp_path: Path,
) -> None:
    problems: list[str | None] = []
    with small_disk(tmp_path / "disk", "64k") as disk:
        trail = AuditTrail(disk, "s1", retry=0.1, max_held=4096, on_problem=problems.append)
        trail.open()
        trail.write(resleeve(0))
        assert await trail.synced() is True
        filler = fill(disk)
        n = 0
        while n < 100:  # the file's last page takes a few more; then the disk refuses
            n += 1
            trail.write(resleeve(n))
            if not await trail.synced():
                break
        assert trail.problem is not None and "No space left on device" in trail.problem
        assert len(problems) == 1  # said once
        started = asyncio.get_running_loop().time()
        trail.write(resleeve(n + 1))
        assert await trail.synced() is False  # told at once: not on disk, held
        assert asyncio.get_running_loop().time() - started < 0.5
        last = n + 80
        for m in range(n + 2, last + 1):  # more than max_held: the oldest held go, counted
            trail.write(resleeve(m))
        assert trail.dropped > 0
        assert len(b"".join(trail.held)) <= 4096 + 200
        assert json.loads(trail.held[-1])["seq"] == last + 1  # resleeve(k) is seq k + 1
        assert len(problems) == 1
        filler.unlink()  # room again: the next try writes what is held
        await wait_for_async(lambda: trail.problem is None, 10, what="the trail written again")
        assert await trail.synced() is True
        assert problems == [problems[0], None]
        got = lines(disk / NAME)
        seqs = [r["seq"] for r in got]
        assert seqs[0] == 1 and last + 1 in seqs and seqs == sorted(seqs)
        assert got[-1]["type"] == "audit-dropped" and got[-1]["count"] == trail.dropped
        await trail.close()


async def test_a_trail_whose_directory_cannot_be_written_keeps_the_records_in_memory(
    tmp_path: Path,
) -> None:
    gone = tmp_path / "not-a-dir"
    gone.write_text("")
    trail = AuditTrail(gone, "s1", retry=0.05)
    trail.open()
    trail.write(resleeve(1))
    assert await trail.synced() is False
    assert trail.problem is not None and str(gone) in trail.problem
    assert len(trail.held) == 1
    await trail.close()
    assert os.path.isfile(gone)


async def test_a_record_nobody_waits_for_is_batched_and_synced_on_demand(tmp_path: Path) -> None:
    """Egress connections are written lazily (a batch within LAZY seconds, not an fsync each);
    anyone waiting for the disk flushes them at once."""
    trail = AuditTrail(tmp_path, "s1")
    trail.open()
    for n in range(3):
        trail.write(resleeve(n), lazy=True)
    assert not (tmp_path / NAME).exists() or lines(tmp_path / NAME) == []
    await wait_for_async(
        lambda: (tmp_path / NAME).exists() and len(lines(tmp_path / NAME)) == 3,
        5,
        what="the lazy batch",
    )
    trail.write(resleeve(3), lazy=True)
    assert await trail.synced() is True  # waited for: written now, not after the delay
    assert len(lines(tmp_path / NAME)) == 4
    await trail.close()
