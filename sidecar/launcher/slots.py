"""Slots: several CLI identities per project, in ClaudeBox's on-disk layout.

Ids are bit-for-bit ClaudeBox's (POSIX `cksum` chained over decimal text), so existing
ClaudeBox slot directories can be adopted; creation and removal hold an flock on the project dir.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from sidecar.launcher import homes
from sidecar.launcher.fsutil import LauncherError, atomic_write, locked, private_dir, touch_private

logger = logging.getLogger(__name__)

COUNTER_FILE = ".project_container_counter"
# A counter rebuilt from directories stops looking after this many chain steps; ClaudeBox
# projects with more slots than this do not exist in practice.
RECOUNT_LIMIT = 10_000

_MASK = 0xFFFFFFFF


def _crc_table() -> tuple[int, ...]:
    # POSIX cksum: polynomial 0x04C11DB7, MSB first, no reflection (unlike zlib's CRC-32).
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & _MASK)
    return tuple(table)


_TABLE = _crc_table()


def cksum(data: bytes) -> int:
    """The CRC printed by POSIX `cksum` for `data` (length folded in, then complemented)."""
    crc = 0
    table = _TABLE
    for byte in data:
        crc = ((crc << 8) & _MASK) ^ table[(crc >> 24) ^ byte]
    length = len(data)
    while length:  # the length, least significant byte first, only as many bytes as needed
        crc = ((crc << 8) & _MASK) ^ table[(crc >> 24) ^ (length & 0xFF)]
        length >>= 8
    return ~crc & _MASK


def slot_chain(root: Path, count: int) -> list[str]:
    """Ids `%08x` of slots 0..count: crc0 = cksum(root), crcN = cksum(decimal text of crcN-1)."""
    value = cksum(os.fsencode(str(root)))
    ids = [f"{value:08x}"]
    for _ in range(count):
        value = cksum(str(value).encode())
        ids.append(f"{value:08x}")
    return ids


def slugify(root: Path) -> str:
    """ClaudeBox's slug: drop the leading `/`, every other non-[A-Za-z0-9_] becomes `_`."""
    text = str(root).removeprefix("/")
    return re.sub(r"[^A-Za-z0-9_]", "_", text).lower()


class SlotState(enum.Enum):
    AUTHENTICATED = "authenticated"
    UNAUTHENTICATED = "unauthenticated"
    DEAD = "dead"  # the index is within the counter but its directory is gone


@dataclass(frozen=True)
class Slot:
    index: int
    id: str
    path: Path
    state: SlotState


@dataclass(frozen=True)
class Project:
    """One project (canonical root) under `$SLEEVE_HOME/projects/<slug>_<crc0>/`."""

    root: Path
    home: Path
    read_only: bool = False  # --dry-run: a corrupt counter is recomputed but not rewritten

    # Cached: derived from the frozen fields, and used in every per-slot path below.
    @functools.cached_property
    def crc0(self) -> str:
        return slot_chain(self.root, 0)[0]

    @functools.cached_property
    def key(self) -> str:
        return f"{slugify(self.root)}_{self.crc0}"

    @functools.cached_property
    def dir(self) -> Path:
        return self.home / "projects" / self.key

    def container_name(self, slot_id: str) -> str:
        return f"sleeve-{self.key}-{slot_id}"

    def slot_path(self, index: int) -> Path:
        return self.dir / slot_chain(self.root, index)[index]

    def unmade_slot(self, index: int) -> Slot:
        """Slot `index` before `sleeve create` makes it: its id is known before its folder
        exists (what a dry run and `sleeve manifest` show for a project without slots)."""
        path = self.slot_path(index)
        return Slot(index, path.name, path, SlotState.DEAD)

    # -- the counter -------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the project dir like ClaudeBox's init_project_dir (counter starts at 1)."""
        private_dir(self.dir)
        with locked(self.dir):  # parallel creates of a new project must not reset the counter
            if not (self.dir / COUNTER_FILE).exists() and not self._slot_dirs():
                atomic_write(self.dir / COUNTER_FILE, "1")
            # (a counter missing beside slot dirs is rebuilt by read_counter, with a warning)
            touch_private(self.dir / "profiles.ini")
            path_file = self.dir / ".project_path"
            recorded = path_file.read_bytes() if path_file.exists() else None
            if recorded != os.fsencode(str(self.root)) + b"\n":
                atomic_write(path_file, os.fsencode(str(self.root)) + b"\n")

    def read_counter(self) -> int:
        """The recorded highest slot index; a missing or corrupt file is rebuilt, with a warning.

        A value beyond RECOUNT_LIMIT is corrupt too: the id chain up to it would take forever.
        """
        try:
            text = (self.dir / COUNTER_FILE).read_text().strip()
            value = int(text)
            if not 0 <= value <= RECOUNT_LIMIT:
                raise ValueError(text)
        except FileNotFoundError:
            why = "missing"
        except (ValueError, UnicodeDecodeError):
            why = "corrupt"
        else:
            return value
        value = self._recount()
        logger.warning(
            "%s in %s was %s; recomputed %d from the slot directories",
            COUNTER_FILE,
            self.dir,
            why,
            value,
        )
        if not self.read_only:
            atomic_write(self.dir / COUNTER_FILE, str(value))
        return value

    def _slot_dirs(self) -> set[str]:
        return {
            p.name
            for p in self.dir.iterdir()
            if p.is_dir() and re.fullmatch(r"[0-9a-f]{8}", p.name)
        }

    def _recount(self) -> int:
        names = self._slot_dirs()
        highest = 0
        if names:
            for index, slot_id in enumerate(slot_chain(self.root, RECOUNT_LIMIT)):
                if index and slot_id in names:
                    highest = index
                    names.discard(slot_id)
                    if not names:
                        break
        return highest

    # -- slots -------------------------------------------------------------------------

    def slots(self, *, prune: bool = True) -> list[Slot]:
        """Slots 1..counter; with `prune` the counter first drops to the highest existing slot."""
        if not self.dir.is_dir():
            return []
        with locked(self.dir):
            top = self.read_counter()
            ids = slot_chain(self.root, top)
            slots = [self._slot(index, ids[index]) for index in range(1, top + 1)]
            if prune:
                while slots and slots[-1].state is SlotState.DEAD:
                    slots.pop()
                if len(slots) != top and not self.read_only:
                    atomic_write(self.dir / COUNTER_FILE, str(len(slots)))
        return slots

    def _slot(self, index: int, slot_id: str) -> Slot:
        path = self.dir / slot_id
        if not path.is_dir():
            state = SlotState.DEAD
        elif homes.signed_in(path):
            state = SlotState.AUTHENTICATED
        else:
            state = SlotState.UNAUTHENTICATED
        return Slot(index, slot_id, path, state)

    def create(self) -> Slot:
        """Reuse the first dead slot in 1..counter, else make counter+1 (under the project lock)."""
        self.ensure()
        with locked(self.dir):
            top = self.read_counter()
            ids = slot_chain(self.root, top + 1)
            index = next(
                (i for i in range(1, top + 1) if not (self.dir / ids[i]).is_dir()), top + 1
            )
            # The chain is periodic from its first repeated id on: a repeat has no new id left.
            if index > RECOUNT_LIMIT or ids[index] in ids[1:index]:
                msg = f"{self.root} already has {index - 1} slots; `sleeve rm N` frees one"
                raise LauncherError(msg)
            path = self.dir / ids[index]
            private_dir(path)
            homes.make_dirs(path)
            if index > top:
                atomic_write(self.dir / COUNTER_FILE, str(index))
        logger.info("created slot %d (%s) for %s", index, ids[index], self.root)
        return self._slot(index, ids[index])

    def get(self, index: int) -> Slot:
        """Slot `index` as it is now; an index outside 1..counter is a LauncherError."""
        if not self.dir.is_dir():
            return self._get(index, 0)
        with locked(self.dir):
            return self._get(index, self.read_counter())

    def _get(self, index: int, top: int) -> Slot:
        if not 1 <= index <= top:
            msg = f"no slot {index} for {self.root} (slots are 1..{top}; `sleeve create` adds one)"
            raise LauncherError(msg)
        return self._slot(index, slot_chain(self.root, index)[index])

    def remove(self, index: int) -> Slot:
        """Delete slot `index`'s directory under the project lock (the caller checks running)."""
        if not self.dir.is_dir():
            self._get(index, 0)  # raises: a project without a dir has no slots
        with locked(self.dir):
            slot = self._get(index, self.read_counter())
            if slot.state is SlotState.DEAD:
                msg = f"slot {index} is already dead (its directory is gone)"
                raise LauncherError(msg)
            if slot.path.is_symlink():
                msg = f"refusing to remove {slot.path}: it is a symlink"
                raise LauncherError(msg)
            shutil.rmtree(slot.path)
        logger.info("removed slot %d (%s)", index, slot.id)
        return slot


def prepare_home_files(slot: Slot) -> None:
    """Make every bind source the CLI home needs exist (a missing one becomes a dir in Docker)."""
    homes.make_slot(slot.path)
    with contextlib.suppress(OSError):
        os.chmod(slot.path, 0o700)
