"""Prints `count` numbered lines (`line 000001` ...) one every `interval` seconds, then
`numbers done`, and stays up. Writes its pid to argv[3] first (atomically).

`python numbers.py COUNT INTERVAL PIDFILE`: a CLI that keeps writing to its terminal while the
supervisor is killed and started again; every line must reach the pane, in order.
"""

import os
import sys
import time

count, interval, pidfile = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
with open(pidfile + ".tmp", "w") as fh:
    fh.write(str(os.getpid()))
os.replace(pidfile + ".tmp", pidfile)
for n in range(1, count + 1):
    print(f"line {n:06d}", flush=True)
    time.sleep(interval)  # sleep-ok: the CLI's own pace, not a synchronisation
print("numbers done", flush=True)
while True:
    time.sleep(3600)  # sleep-ok: a CLI that just stays up
