"""Codex CLI (0.169), all the sidecar and the launcher know of it: its hooks, reported through
the relay (`hooks`), its screen (`screen`), read beside them, and its usage (`telemetry`).
"""

from sidecar.agent.clis.codex.hooks import HOOKS
from sidecar.agent.clis.codex.screen import read_screen
from sidecar.agent.clis.codex.telemetry import TELEMETRY
from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, ScreenKnowledge
from sidecar.agent.screens import Seen

CLI = Knowledge(
    __name__,
    "codex",
    ("codex",),
    # Its fallback: a pinned conversation is resumed by id (`hooks`).
    resume=("codex", "resume", "--last"),
    state="hooks",
    hooks=HOOKS,
    screen=ScreenKnowledge(
        read_screen,
        frozenset(Seen),
        # Its approval dialog ("1. Yes, proceed (y)", "2. Yes, and don't ask again for commands
        # that start with ...", "3. No, and tell Codex what to do differently (esc)"), for a
        # dialog the hook no longer holds (a released hook, a supervisor crash).
        ApprovalKeys(once=("y",), always=("Down", "Enter"), deny=("Escape",)),
        keys_after=0.0,  # its dialogs take keys as they are drawn (measured on 0.169)
    ),
    homes=Homes(dirs=(".codex",)),  # config, sign-in, conversations
    telemetry=TELEMETRY,
    interrupt=("Escape",),  # "esc to interrupt" while a turn runs
)
