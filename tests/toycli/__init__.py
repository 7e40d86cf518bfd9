"""A toy fifth CLI, registered from outside the sidecar (`SIDECAR_CLI_PACKAGES=tests.toycli`):
the worked example of docs/adding-a-cli.md. Its program (`toy.py`) reports its state through the
sidecar's hook relay, asks permission in a dialog answered by keys, and resumes by id.
"""

import sys
from pathlib import Path

from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, ScreenKnowledge
from sidecar.agent.screens import Seen
from tests.toycli.hooks import HOOKS
from tests.toycli.screen import read_screen

PROGRAM = Path(__file__).with_name("toy.py")

CLI = Knowledge(
    __name__,
    "toy",
    (sys.executable, str(PROGRAM)),
    # What it resumes while no conversation id is known; a pinned one is resumed by id (`hooks`).
    resume=(sys.executable, str(PROGRAM), "--continue"),
    state="hooks",
    hooks=HOOKS,
    screen=ScreenKnowledge(
        read_screen,
        frozenset(Seen),
        # Its dialog takes a line: the choice's digit, then Enter.
        ApprovalKeys(once=("1", "Enter"), always=("2", "Enter"), deny=("3", "Enter")),
    ),
    homes=Homes(dirs=(".toy",)),
)
