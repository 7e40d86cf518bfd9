"""Writes its pid to argv[1], then waits for a signal (the default actions end it)."""

import os
import signal
import sys

with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print("pidfile ready", flush=True)
while True:
    signal.pause()
