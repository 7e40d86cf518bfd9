"""A CLI that ignores SIGHUP and SIGTERM, and has a child that does the same.

Only SIGKILL ends it: `tmux respawn-pane -k` alone would leave it running, orphaned.
Writes "<pid> <child pid>" to the file named by argv[1] once both are set up.
"""

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
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {child}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("stubborn ready", flush=True)
while True:
    time.sleep(3600)
