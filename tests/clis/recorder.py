"""A stubborn CLI that says how it was started: it ignores SIGHUP and SIGTERM, as does a child it
forks (only SIGKILL ends them), appends `{"pid", "child", "argv"}` as one JSON line to the file
named by argv[1], and prints `recorder <pid> ready` to its terminal."""

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
print(f"recorder {os.getpid()} ready", flush=True)
while True:
    time.sleep(3600)
