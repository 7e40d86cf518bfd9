"""Keeps the parsed `.cstack/CURRENT.md` current and turns its changes into events. A change is
noticed by `stat` alone (inode, size, mtime): the file is parsed again only when one of those
moved, whether the caller is `/status` or the once-a-second tick.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.core.event_shapes import Completion, ProgressUpdate
from sidecar.core.events import EventBus
from sidecar.core.shapes import Progress
from sidecar.security.acting import Owner
from sidecar.workspace.cstack import CurrentState
from sidecar.workspace.cstack_files import read_current

StatKey = tuple[int, int, int] | None


def _progress(state: CurrentState) -> ProgressUpdate:
    return ProgressUpdate(
        status=state.status,
        task=state.task,
        progress=Progress(total=state.progress_total, completed=state.progress_completed),
    )


def _same(a: ProgressUpdate, b: ProgressUpdate) -> bool:
    return (a.status, a.task, a.progress) == (b.status, b.task, b.progress)


class CurrentWatcher:
    def __init__(
        self,
        path: Path,
        bus: EventBus,
        workspace: Path | None = None,
        owner: Owner | None = None,
    ) -> None:
        self.path = path
        self._bus = bus
        self._workspace = workspace  # symlinks are followed only inside it
        self._owner = owner  # looked at as the CLI's user (see sidecar.security.acting)
        self._key: StatKey = None
        self._state: CurrentState | None = None
        self.mtime: float | None = None

    def _stat(self) -> tuple[StatKey, float | None]:
        try:
            if self._owner is not None and self._owner.act_as:
                with self._owner.acting():
                    st = os.stat(self.path)
            else:  # the common case, once a second and on every /status: no context manager
                st = os.stat(self.path)
        except OSError:
            return None, None
        return (st.st_ino, st.st_size, st.st_mtime_ns), st.st_mtime

    def get(self) -> CurrentState:
        """The parsed file, re-read only if it changed since the last call."""
        key, mtime = self._stat()
        if self._state is not None and key == self._key:
            return self._state
        state = read_current(self.path, self._workspace, self._owner)
        previous = self._state
        self._state, self._key, self.mtime = state, key, mtime
        if previous is not None:
            update = _progress(state)
            if not _same(_progress(previous), update):
                self._bus.publish(update)
                if state.status == "done" and previous.status != "done":
                    self._bus.publish(Completion(task=state.task))
        return state
