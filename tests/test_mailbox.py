"""The mailbox store (sidecar.workspace.mailbox): limits, the parse cache, locking, repair, atomic
writes, and what it refuses (symlinks out of the workspace)."""

from __future__ import annotations

import os
import pathlib
import stat

import pytest

from sidecar.core import files
from sidecar.workspace import mailbox
from sidecar.workspace.mailbox import Mailbox
from sidecar.workspace.needlecast import ParseResult, render_messages
from tests.needlecast_samples import SEED, box_file, msg

# ---------------------------------------------------------------- limits and cache


def test_big_outbox_lists_whole_messages_up_to_the_limit_and_acks_let_the_rest_through(
    tmp_path: pathlib.Path,
) -> None:
    body = "x" * 1000
    messages = [msg(f"msg-{i}", body) for i in range(20_000)]  # ~21 MB
    box = box_file(tmp_path, render_messages(messages))
    assert box.path.stat().st_size > 20 * 1024 * 1024
    first = box.read()
    assert first.truncated
    assert any("only the messages in its first" in w for w in first.warnings)
    n = len(first.messages)
    assert 10_000 < n < 20_000
    assert list(first.messages) == messages[:n]
    with pytest.raises(mailbox.MailboxFullError):
        box.append(msg("msg-more"))
    assert box.remove([m.id for m in first.messages]).removed == n
    rest = box.read()
    assert not rest.truncated
    assert list(rest.messages) == messages[n:]


def test_unchanged_file_is_parsed_once_and_a_change_is_seen(tmp_path: pathlib.Path) -> None:
    box = box_file(tmp_path, render_messages([msg(f"msg-{i}") for i in range(100)]))
    old = box.path.stat().st_mtime_ns - 10_000_000_000
    os.utime(box.path, ns=(old, old))  # settled: older than the racy window
    first = box.read()
    assert box.read() is first
    assert box.parse_count == 1
    box.append(msg("msg-x"))
    assert box.read().messages[-1].id == "msg-x"
    assert box.parse_count == 2


# ---------------------------------------------------------------- files and safety


def test_missing_directory_reads_empty_and_first_append_creates_private_files(
    tmp_path: pathlib.Path,
) -> None:
    box = Mailbox(tmp_path, "inbox")
    assert box.read() == ParseResult((), ())
    assert not (tmp_path / ".needlecast").exists()
    assert box.remove(["msg-1"]).unknown == ("msg-1",)
    box.append(msg("msg-1"))
    assert stat.S_IMODE((tmp_path / ".needlecast").stat().st_mode) == 0o700
    assert stat.S_IMODE(box.path.stat().st_mode) == 0o600
    assert [m.id for m in box.read().messages] == ["msg-1"]


def test_symlinked_dir_outside_workspace_is_refused_and_nothing_written(
    tmp_path: pathlib.Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".needlecast").symlink_to(outside)
    box = Mailbox(ws, "outbox")
    with pytest.raises(mailbox.UnsafePathError, match="outside the workspace"):
        box.append(msg("msg-1"))
    with pytest.raises(mailbox.UnsafePathError):
        box.read()
    assert list(outside.iterdir()) == []


def test_symlinked_dir_inside_workspace_is_fine(tmp_path: pathlib.Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / ".needlecast").symlink_to(tmp_path / "real")
    box = Mailbox(tmp_path, "outbox")
    box.append(msg("msg-1"))
    assert (tmp_path / "real" / "outbox.md").exists()


def test_symlinked_message_file_is_never_followed(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "elsewhere.md"
    target.write_text(SEED)
    (tmp_path / ".needlecast").mkdir()
    (tmp_path / ".needlecast" / "outbox.md").symlink_to(target)
    box = Mailbox(tmp_path, "outbox")
    with pytest.raises(mailbox.UnsafePathError, match="symlink"):
        box.append(msg("msg-1"))
    with pytest.raises(mailbox.UnsafePathError):
        box.remove(["msg-abc123"])
    assert target.read_text() == SEED


def test_torn_append_is_hidden_from_readers_and_cut_by_the_next_writer(
    tmp_path: pathlib.Path,
) -> None:
    """Fakes what a writer killed inside write() leaves (journal + half a message): the OS seam
    cannot be hit on purpose. The real kill -9 tests are in test_needlecast_concurrency."""
    whole = render_messages([msg("msg-1")]).encode()
    half = render_messages([msg("msg-2", "y" * 100)]).encode()[:60]
    box = box_file(tmp_path, whole + half)
    ino = box.path.stat().st_ino
    lock = tmp_path / ".needlecast" / ".outbox.md.lock"
    lock.write_text(f"append {ino} {len(whole)} {len(whole) + 200}\n")
    result = box.read()
    assert [m.id for m in result.messages] == ["msg-1"]
    assert result.warnings == ()
    box.append(msg("msg-3"))
    assert [m.id for m in box.read().messages] == ["msg-1", "msg-3"]
    assert lock.read_bytes() == b""


def test_leftover_temp_file_of_a_killed_rewrite_is_cleaned(tmp_path: pathlib.Path) -> None:
    box = box_file(tmp_path, render_messages([msg("msg-1"), msg("msg-2")]))
    stale = tmp_path / ".needlecast" / ".outbox.md.tmp-1-deadbeef"
    stale.write_text("half")
    assert box.remove(["msg-1"]).removed == 1
    assert not stale.exists()
    assert [m.id for m in box.read().messages] == ["msg-2"]


def test_remove_after_read_cuts_the_right_bytes_in_a_unicode_file(tmp_path: pathlib.Path) -> None:
    messages = [msg(f"msg-{i}", f"ünï ✓ {i} 🚀\n" * (i + 1)) for i in range(6)]
    box = box_file(tmp_path, render_messages(messages))
    assert list(box.read().messages) == messages  # primes the offset index
    assert box.remove(["msg-2", "msg-4"]).removed == 2
    assert box.path.read_text() == render_messages([messages[i] for i in (0, 1, 3, 5)])
    assert box.remove(["msg-0"]).removed == 1  # the index carried over from the rewrite
    assert box.path.read_text() == render_messages([messages[i] for i in (1, 3, 5)])


def test_offsets_known_from_a_read_are_not_trusted_after_an_outside_edit(
    tmp_path: pathlib.Path,
) -> None:
    a, b, c = msg("msg-a", "short"), msg("msg-b", "longer body"), msg("msg-c", "x")
    box = box_file(tmp_path, render_messages([a, b, c]))
    box.read()
    # Same size, same inode, other layout: written in place as an editor without the lock might.
    with open(box.path, "r+b") as f:
        f.write(render_messages([b, a, c]).encode())
    assert box.remove(["msg-a"]).removed == 1
    assert box.path.read_text() == render_messages([b, c])


def test_a_message_appended_without_the_lock_during_a_rewrite_is_kept(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The append is injected at the moment the rewrite writes its temp file: a race with a
    writer that ignores the lock (`cat >> outbox.md`) cannot be timed from outside."""
    box = box_file(tmp_path, render_messages([msg("msg-1"), msg("msg-2")]))
    real_write_all = files.write_all

    def racing_write_all(fd: int, data: bytes) -> None:
        with open(box.path, "ab") as f:  # no lock, like a shell redirect
            f.write(render_messages([msg("msg-late")]).encode())
        monkeypatch.setattr(files, "write_all", real_write_all)
        real_write_all(fd, data)

    monkeypatch.setattr(files, "write_all", racing_write_all)
    assert box.remove(["msg-1"]).removed == 1
    assert [m.id for m in box.read().messages] == ["msg-2", "msg-late"]
