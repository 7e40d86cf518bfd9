"""What agent awareness must keep across a supervisor restart, in one small file of its own in
the state dir (`agent.json`, 0600): Claude Code's pinned session id, the hook and telemetry
secrets of the CLI that runs, its recording, and the inbox messages already announced to the
agent.

Written atomically (temp file + rename) whenever it changes, never on a timer; read back whole or
not at all (a missing or broken file is an empty record). The fields could move into the
supervisor's own state file as they are: one typed record, read and written in one place.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from sidecar.core.files import write_new

log = logging.getLogger(__name__)

MAX_BYTES = 1024 * 1024


class AgentRecord(msgspec.Struct, forbid_unknown_fields=False):
    session_id: str | None = None  # Claude Code's conversation id (--session-id / --resume)
    session_cli: str | None = None  # the CLI the session id belongs to
    hook_secret: str | None = None  # the secret the running CLI's hooks present
    events_url: str | None = None  # the running CLI's own server (opencode), and its password
    events_password: str | None = None
    announced: list[str] = msgspec.field(default_factory=list)  # inbox ids told to the agent
    telemetry_secret: str | None = None  # what the running CLI's usage reports present
    recording: str | None = None  # the recording of the CLI run going on (its id)


@dataclass
class AgentFiles:
    path: Path  # `Layout.agent_state`
    record: AgentRecord = field(default_factory=AgentRecord)

    def load(self) -> AgentRecord:
        try:
            with self.path.open("rb") as fh:
                raw = fh.read(MAX_BYTES + 1)
            self.record = msgspec.json.decode(raw, type=AgentRecord)
        except FileNotFoundError:
            self.record = AgentRecord()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("%s is unusable (%s); starting from an empty record", self.path, exc)
            self.record = AgentRecord()
        return self.record

    def update(self, **changes: object) -> None:
        """Change fields and write the file (failures are logged: the state lives in memory)."""
        new = msgspec.structs.replace(self.record, **changes)
        if new == self.record:
            return
        self.record = new
        try:
            write_new(self.path, msgspec.json.encode(new), 0o600)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)
