"""Claude Code (2.1.330), all the sidecar and the launcher know of it: its hooks (`hooks`: our
`--settings`, its session arguments, what each event means), its screen (`screen`), its usage
(`telemetry`), its resume rule and the folders a slot keeps of it.
"""

from sidecar.agent.clis.claude_code.hooks import HOOKS, history
from sidecar.agent.clis.claude_code.screen import read_screen
from sidecar.agent.clis.claude_code.telemetry import TELEMETRY
from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, ScreenKnowledge
from sidecar.agent.screens import Seen

CLI = Knowledge(
    __name__,
    "claude-code",
    ("claude",),
    # What it does without hooks (a pinned session is resumed by id: `hooks`); `--continue`
    # fails without a conversation, so it resumes exactly when it has one.
    resume=("claude", "--continue"),
    history=history,
    state="hooks",
    hooks=HOOKS,
    screen=ScreenKnowledge(
        read_screen,
        frozenset(Seen),
        # Its permission dialog: "1. Yes" is selected; "2. Yes, and don't ask again ...";
        # Escape is "No" and tells Claude to wait for the person's instructions.
        ApprovalKeys(once=("Enter",), always=("Down", "Enter"), deny=("Escape",)),
        # It drops keys that come within ~0.12-0.15 s of drawing a dialog, and takes them
        # from then on (measured on 2.1.330: Enter at 0.12 s lost 1 of 2, at 0.15 s none).
        keys_after=0.3,
    ),
    # Its config dir is the slot's (read-write: an OAuth refresh rewrites the sign-in); the
    # conversations and prompt history belong to the project, mounted over the config dir's
    # own, so they survive a hard resleeve and follow the project into any slot.
    homes=Homes(
        dirs=(".claude",),
        project_dirs=(".claude/projects",),
        project_files=(".claude/history.jsonl",),
        # `{}` rather than empty: the CLI parses the file and an empty one is invalid JSON.
        files={".claude.json": "{}"},
        sign_in=".claude/.credentials.json",
        seed="claude-credentials",
    ),
    telemetry=TELEMETRY,
    interrupt=("Escape",),  # "esc to interrupt", its footer says while a turn runs
)
