"""Gemini CLI (0.61), all the sidecar and the launcher know of it: its hooks, reported through
the relay (`hooks`), its screen (`screen`), whose tool confirmation is answered by keys, and its
usage (`telemetry`).
"""

from sidecar.agent.clis.gemini_cli.hooks import HOOKS
from sidecar.agent.clis.gemini_cli.screen import read_screen
from sidecar.agent.clis.gemini_cli.telemetry import TELEMETRY
from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, ScreenKnowledge
from sidecar.agent.screens import Seen

CLI = Knowledge(
    __name__,
    "gemini-cli",
    ("gemini",),
    # What it does without hooks; a pinned session is resumed by id (`hooks`).
    resume=("gemini", "--resume", "latest"),
    state="hooks",
    hooks=HOOKS,
    screen=ScreenKnowledge(
        read_screen,
        frozenset(Seen),
        # Its tool confirmation ("1. Allow once", "2. Allow for this session", "3. No, suggest
        # changes (esc)"): a digit picks its choice at once.
        ApprovalKeys(once=("1",), always=("2",), deny=("3",)),
        keys_after=0.0,  # its dialogs take keys as they are drawn (measured on 0.61)
    ),
    homes=Homes(dirs=(".gemini",)),  # config, sign-in, conversations
    telemetry=TELEMETRY,
    interrupt=("Escape",),  # "esc to cancel" while a turn runs
)
