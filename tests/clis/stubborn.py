"""A CLI that ignores SIGHUP and SIGTERM, and has a child that does the same.

Only SIGKILL ends it: `tmux respawn-pane -k` alone would leave it running, orphaned.
Once both are set up it appends `{"pid", "child", "argv"}` as one JSON line to the file named
by argv[1] (one line per start: a test can tell a resume from a first start by argv) and prints
`stubborn <pid> ready` to its terminal.
"""

import json
import os
import signal
import sys
import time

for sig in (signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, signal.SIG_IGN)
child = os.fork()
if child == 0:
    while True:
        signal.pause()
with open(sys.argv[1], "a") as fh:
    fh.write(json.dumps({"pid": os.getpid(), "child": child, "argv": sys.argv}) + "\n")
print(f"stubborn {os.getpid()} ready", flush=True)
while True:
    time.sleep(3600)  # sleep-ok: a CLI that just stays up
