"""opencode (1.18.33), all the sidecar and the launcher know of it: the TUI started with its
server on a loopback port of ours, whose event stream tells the agent's state and carries its
permission requests (`events`) and its model requests' usage (`usage`), and its screen
(`screen`), read beside it.
"""

from sidecar.agent.clis.opencode.events import STREAM
from sidecar.agent.clis.opencode.screen import read_screen
from sidecar.agent.knowledge import ApprovalKeys, Homes, Knowledge, ScreenKnowledge
from sidecar.agent.screens import Seen

CLI = Knowledge(
    __name__,
    "opencode",
    ("opencode",),
    # What it resumes while no session id is known; a pinned one is resumed by id (`events`).
    resume=("opencode", "--continue"),
    state="events",
    events=STREAM,
    screen=ScreenKnowledge(
        read_screen,
        frozenset(Seen),
        # For when its server is not reachable: "Allow once" is selected first; "Allow always"
        # asks to confirm ("Confirm" selected first); "Reject" is the third choice (all three
        # seen on 1.18.33).
        ApprovalKeys(
            once=("Enter",), always=("Right", "Enter", "Enter"), deny=("Right", "Right", "Enter")
        ),
        keys_after=0.0,  # its dialogs take keys as they are drawn (measured on 1.18.33)
    ),
    # Its data (sign-in, conversations); its config is under `.config`, which every slot keeps.
    homes=Homes(dirs=(".local/share/opencode",)),
    # "esc interrupt", then "esc again to interrupt": the second Escape stops the turn.
    interrupt=("Escape", "Escape"),
)
