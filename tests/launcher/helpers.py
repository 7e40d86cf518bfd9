"""Helpers shared by the launcher tests (imported relatively, so no package layout is assumed)."""

from __future__ import annotations

import csv
import io
import itertools
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A child process that waits, without sleeping, until a signal ends it.
LIVES_UNTIL_KILLED = [sys.executable, "-c", "import signal; signal.pause()"]
SLEEVE = [sys.executable, "-c", "from sidecar.launcher.cli import main; raise SystemExit(main())"]
# An API key as a user would have one: it must reach the sandbox and never an argv or a log.
SECRET = "sk-ant-api03-TESTKEY-abcdefghij0123456789"
RUN_ID = re.compile(r"\d{14}-[0-9a-f]{6}")  # a run's id, in names and argvs
# ClaudeBox's own shell functions for slot ids, the reference the launcher's ids are checked and
# benchmarked against: `generate_container_name ROOT N` prints slot N's id.
CLAUDEBOX_ID_FUNCTIONS = r"""
crc32_word() { printf '%s' "$1" | cksum | cut -d' ' -f1; }
generate_container_name() {
    local cur; cur=$(crc32_word "$1")
    for ((i=0; i<$2; i++)); do cur=$(crc32_word "$cur"); done
    printf '%08x\n' "$cur"
}
"""


@dataclass
class Result:
    code: int
    out: str
    err: str


def mount_fields(argv: list[str]) -> list[dict[str, str]]:
    found = []
    for flag, value in itertools.pairwise(argv):
        if flag == "--mount":
            (row,) = csv.reader(io.StringIO(value, newline=""))
            found.append(dict(f.split("=", 1) if "=" in f else (f, "") for f in row))
    return found
