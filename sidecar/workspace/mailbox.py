"""The mailbox store: one needlecast message file (`.needlecast/inbox.md` or `outbox.md`) on disk.

One ``flock`` shared by every writer, journalled appends (a torn end is repaired), temp file +
fsync + rename rewrites that keep the file's mode and owner, symlinks never followed, a parse
cache; the text itself is `sidecar.workspace.needlecast`'s. Given an `acting.Owner`, the files are
handled as the CLI's user and what is created belongs to it. Limits: a read parses at most
MAX_FILE_BYTES (16 MiB) and then lists only whole messages, marks the answer truncated and says
so in a warning; appends to a file that big are refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import logging
import os
import secrets
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from sidecar.core import files
from sidecar.security.acting import Owner, acting, claim
from sidecar.workspace.needlecast import (
    Message,
    ParseResult,
    message_ids,
    parse_bytes,
    render_message,
)
from sidecar.workspace.needlecast_bounds import blank_line_after, window_cut

logger = logging.getLogger(__name__)

#: Bytes of a message file that a read parses; past it the answer is marked truncated, and
#: appends are refused (an envoy acks what it saw and reads again to see the rest).
MAX_FILE_BYTES = 16 * 1024 * 1024
NEEDLECAST_DIR = ".needlecast"
_RACY_NS = 2_000_000_000  # a file changed this recently may change again within one mtime tick


class NeedlecastError(Exception):
    """A message file cannot be read or written."""


class UnsafePathError(NeedlecastError):
    """`.needlecast/` or a message file leads outside the workspace (symlink)."""


class MailboxFullError(NeedlecastError):
    """The message file is past :data:`MAX_FILE_BYTES`; appends are refused until it drains."""


@dataclasses.dataclass(frozen=True)
class RemoveResult:
    removed: int  # messages taken out of the file
    unknown: tuple[str, ...]  # asked-for ids that were not there


class _Index(NamedTuple):
    """Where each message of a window of file bytes sits, keyed by the window's SHA-256: lets a
    removal right after a read (or another removal) skip parsing. Keyed by content, not by
    stat, so it can never describe bytes that are not there."""

    digest: bytes
    truncated: bool
    head_end: int  # end of the part reads list and removals touch (bytes)
    entries: tuple[tuple[int, int, str], ...]  # (start, end, id)


def _index_fits(index: _Index, data: bytes, truncated: bool) -> bool:
    return index.truncated == truncated and index.digest == hashlib.sha256(data).digest()


class Mailbox:
    """One message file (`inbox` or `outbox`) in `<workspace>/.needlecast/`.

    Every writer (append, remove; any process) holds an exclusive ``flock`` on
    `.needlecast/.<name>.md.lock`; readers hold a shared one just while reading the bytes, so they
    never see an append half-written. Rewrites go to a temp file in the same directory, are
    fsynced and renamed over the file, so a reader or a crash sees the old or the new version.
    An append is one O_APPEND write plus fsync; before it, the writer records the file's size in
    the lock file (the journal) and clears it after. A journal left by a writer killed mid-write
    tells readers where the file really ends and makes the next writer cut the torn tail off.

    Other writers (the CLI's tools) should take the same lock, e.g. ``flock
    .needlecast/.outbox.md.lock sh -c 'cat msg.md >> .needlecast/outbox.md'``. One that does not
    is carried over by a concurrent rewrite except in the instant before its rename, and a reader
    may see its message half-written.
    """

    def __init__(
        self,
        workspace: Path,
        name: str,
        *,
        max_bytes: int = MAX_FILE_BYTES,
        owner: Owner | None = None,
    ) -> None:
        self.workspace = workspace
        self.owner = owner
        self.filename = f"{name}.md"
        self.path = workspace / NEEDLECAST_DIR / self.filename
        self.lockname = f".{name}.md.lock"
        self._temp_prefix = f".{self.filename}.tmp-"  # a rewrite's new file, until its rename
        self.max_bytes = max_bytes
        self.parse_count = 0  # how many times the file was really parsed (the cache's witness)
        self._cache: tuple[tuple[int, ...], ParseResult] | None = None
        self._index: _Index | None = None

    def _open_dir(self, *, create: bool) -> int | None:
        """A descriptor of `.needlecast/` (None if missing and not `create`); every file operation
        goes through it, so a symlink swapped in later is never followed."""
        root = self.workspace.resolve()
        real = (root / NEEDLECAST_DIR).resolve()
        if not real.is_relative_to(root):
            msg = f"{NEEDLECAST_DIR} resolves to {real}, outside the workspace {root}; refusing"
            raise UnsafePathError(msg)
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(real, flags)
        except FileNotFoundError:
            if not create:
                return None
        made = False
        with contextlib.suppress(FileExistsError):
            os.mkdir(real, 0o700)  # messages are private to the user running the CLI
            made = True
        fd = os.open(real, flags)
        if made:
            claim(self.owner, fd)
        return fd

    def _open(self, dfd: int, name: str, flags: int) -> int:
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            if flags & os.O_CREAT:
                # Made here (O_EXCL tells): it belongs to the workspace's owner. One that exists
                # keeps its owner.
                try:
                    fd = os.open(name, flags | os.O_EXCL, 0o600, dir_fd=dfd)
                except FileExistsError:
                    flags &= ~os.O_CREAT
                else:
                    claim(self.owner, fd)
                    return fd
            return os.open(name, flags, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink: never followed
                msg = f"{NEEDLECAST_DIR}/{name} is a symlink; refusing to follow it"
                raise UnsafePathError(msg) from exc
            raise

    @contextlib.contextmanager
    def _locked(self, dfd: int, *, exclusive: bool) -> Iterator[int]:
        fd = self._open(dfd, self.lockname, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield fd
        finally:
            os.close(fd)  # closing drops the lock

    @staticmethod
    def _torn_end(lock_fd: int, st: os.stat_result) -> int | None:
        """Where the file really ends if a writer died mid-append (journal says so), else None."""
        raw = os.pread(lock_fd, 128, 0).split()
        if len(raw) != 4 or raw[0] != b"append" or not all(p.isdigit() for p in raw[1:]):
            return None
        inode, start, end = (int(p) for p in raw[1:])
        if inode == st.st_ino and start <= st.st_size < end:
            return start
        return None

    def _repair(self, dfd: int, lock_fd: int) -> None:
        """Under the exclusive lock: cut a torn append off and clear the journal."""
        if os.fstat(lock_fd).st_size == 0:
            return
        with contextlib.suppress(FileNotFoundError):
            fd = self._open(dfd, self.filename, os.O_RDWR)
            try:
                torn = self._torn_end(lock_fd, os.fstat(fd))
                if torn is not None:
                    logger.warning("%s: cutting a torn append off at byte %d", self.path, torn)
                    os.ftruncate(fd, torn)
                    os.fsync(fd)
            finally:
                os.close(fd)
        os.ftruncate(lock_fd, 0)

    # ------------------------------------------------------------ read

    def read(self) -> ParseResult:
        """The messages (at most :attr:`max_bytes` of the file), cached by (inode, mtime, size)."""
        with acting(self.owner):
            return self._read()

    def _read(self) -> ParseResult:
        dfd = self._open_dir(create=False)
        if dfd is None:
            return ParseResult((), ())
        try:
            try:
                fd = self._open(dfd, self.filename, os.O_RDONLY)
            except FileNotFoundError:
                return ParseResult((), ())
            try:
                with self._locked(dfd, exclusive=False) as lock_fd:
                    st = os.fstat(fd)
                    torn = self._torn_end(lock_fd, st)
                    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size, torn or -1)
                    cached = self._cache
                    if cached is not None and cached[0] == key:
                        return cached[1]
                    size = st.st_size if torn is None else torn
                    data = os.pread(fd, min(size, self.max_bytes), 0)
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        result = self._parse(data, size)
        # An entry for a file changed within the last moment could outlive a same-size rewrite
        # in the same mtime tick (git's "racy clean" problem), so only settled files are cached.
        if time.time_ns() - st.st_mtime_ns > _RACY_NS:
            self._cache = (key, result)
        return result

    def stat(self) -> os.stat_result:
        """The file's `stat`, as the CLI's user sees it (raises OSError): with SIDECAR_USER the
        sidecar has no DAC_OVERRIDE, and a workspace private to the user is closed to root."""
        with acting(self.owner):
            return os.stat(self.path)

    def peek(self) -> ParseResult | None:
        """The last read's result if the file has not changed since (one `stat`: no lock, no
        parse, fit for the event loop); None when it has, or when nothing is cached."""
        cached = self._cache
        try:
            st = self.stat()
        except FileNotFoundError:
            return ParseResult((), ())
        except OSError:
            return None
        if cached is None or cached[0][4] != -1:  # nothing read yet, or a torn end was seen
            return None
        if (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size) != cached[0][:4]:
            return None
        return cached[1]

    def _parse(self, data: bytes, size: int) -> ParseResult:
        self.parse_count += 1
        truncated = size > len(data)
        cut = window_cut(data, truncated)
        result, entries = parse_bytes(data[:cut])
        digest = hashlib.sha256(data).digest()
        self._index = _Index(digest, truncated, cut, tuple(entries))
        warnings = list(result.warnings)
        messages = result.messages
        if truncated:
            warnings.append(
                f"{self.filename} is {size} bytes; only the messages in its first "
                f"{self.max_bytes} bytes are listed, ack them to see the rest"
            )
        return ParseResult(messages, tuple(warnings), truncated)

    # ------------------------------------------------------------ write

    def append(self, message: Message) -> None:
        """Add one message at the end (raises MailboxFullError past :attr:`max_bytes`)."""
        with acting(self.owner):
            self._append(message)

    def _append(self, message: Message) -> None:
        data = render_message(message).encode()
        dfd = self._open_dir(create=True)
        assert dfd is not None
        try:
            with self._locked(dfd, exclusive=True) as lock_fd:
                self._repair(dfd, lock_fd)
                fd = self._open(dfd, self.filename, os.O_RDWR | os.O_APPEND | os.O_CREAT)
                try:
                    st = os.fstat(fd)
                    if st.st_size >= self.max_bytes:
                        msg = f"{self.filename} holds {st.st_size} bytes (limit {self.max_bytes})"
                        raise MailboxFullError(msg)
                    data = blank_line_after(os.pread(fd, 3, max(0, st.st_size - 3))) + data
                    end = st.st_size + len(data)
                    os.pwrite(lock_fd, f"append {st.st_ino} {st.st_size} {end}\n".encode(), 0)
                    files.write_all(fd, data)
                    os.fsync(fd)
                    if st.st_size == 0:
                        os.fsync(dfd)  # the file may be new: make its name durable too
                finally:
                    os.close(fd)
                os.ftruncate(lock_fd, 0)
        finally:
            os.close(dfd)

    def remove(self, ids: Iterable[str]) -> RemoveResult:
        """Take exactly the messages with these ids out (within the first :attr:`max_bytes`, the
        part :meth:`read` shows); everything else stays byte for byte."""
        with acting(self.owner):
            return self._remove(set(ids))

    def _remove(self, wanted: set[str]) -> RemoveResult:
        dfd = self._open_dir(create=False)
        if dfd is None or not wanted:
            if dfd is not None:
                os.close(dfd)
            return RemoveResult(0, tuple(sorted(wanted)))
        try:
            with self._locked(dfd, exclusive=True) as lock_fd:
                self._repair(dfd, lock_fd)
                self._drop_stale_temps(dfd)
                try:
                    fd = self._open(dfd, self.filename, os.O_RDONLY)
                except FileNotFoundError:
                    return RemoveResult(0, tuple(sorted(wanted)))
                try:
                    return self._remove_locked(dfd, fd, wanted)
                finally:
                    os.close(fd)
        finally:
            os.close(dfd)

    def _remove_locked(self, dfd: int, fd: int, wanted: set[str]) -> RemoveResult:
        size = os.fstat(fd).st_size
        data = os.pread(fd, min(size, self.max_bytes), 0)
        truncated = size > len(data)
        index = self._index
        if index is None or not _index_fits(index, data, truncated):
            cut = window_cut(data, truncated)
            entries = message_ids(data[:cut])
            index = _Index(b"", truncated, cut, tuple(entries))
        kept: list[bytes] = []
        new_entries: list[tuple[int, int, str]] = []
        pos = 0
        dropped = 0  # bytes removed so far, to shift the entries that stay
        found: set[str] = set()
        for start, end, ident in index.entries:
            if ident in wanted:
                kept.append(data[pos:start])
                pos = end
                found.add(ident)
                dropped += end - start
            else:
                new_entries.append((start - dropped, end - dropped, ident))
        unknown = tuple(sorted(wanted - found))
        if not found:
            self._index = index._replace(digest=index.digest or hashlib.sha256(data).digest())
            return RemoveResult(0, unknown)
        kept.append(data[pos : index.head_end])
        head = b"".join(kept)
        self._rewrite(dfd, head, fd, index.head_end, size)
        removed = len(index.entries) - len(new_entries)
        # The new file is `head` + the old tail: when there is no tail we know it exactly.
        self._index = (
            None
            if truncated
            else _Index(hashlib.sha256(head).digest(), False, len(head), tuple(new_entries))
        )
        return RemoveResult(removed, unknown)

    def _rewrite(self, dfd: int, head: bytes, src: int, tail_from: int, size: int) -> None:
        """New content = head + src[tail_from:size], swapped in atomically and durably."""
        name = Path(self.filename)
        temp = f"{self._temp_prefix}{os.getpid()}-{secrets.token_hex(4)}"
        with files.replacing(name, 0o600, sync=files.Sync.RENAME, dir_fd=dfd, temp=temp) as out:
            claim(self.owner, out)  # as `_open` does with every file it makes
            # The new file keeps the old one's mode and owner (not the sidecar's 0600).
            files.keep_owner(out, os.fstat(src))
            files.write_all(out, head)
            offset = end = tail_from
            while True:  # the tail past the read limit, copied in bounded chunks
                while offset < end:
                    chunk = os.pread(src, min(1 << 20, end - offset), offset)
                    if not chunk:
                        break
                    files.write_all(out, chunk)
                    offset += len(chunk)
                # Until it stops growing: a writer that ignores the lock (`cat >> outbox.md`)
                # may have appended since we read, and its message must not vanish with the
                # old file. Only the moment between this check and the rename stays open to
                # such writers; writers that take the lock never race here.
                end = max(size, os.fstat(src).st_size)
                if end <= offset:
                    break
        logger.debug("%s rewritten (%d bytes)", self.path, len(head) + offset - tail_from)

    def _drop_stale_temps(self, dfd: int) -> None:
        """Temp files of a rewrite killed before its rename (we hold the lock: none is live)."""
        for name in os.listdir(dfd):
            if name.startswith(self._temp_prefix):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=dfd)
