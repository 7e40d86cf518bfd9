"""The agent's daemon: started by the CLI, it leaves the CLI's session and renames every entry
of each directory given (and back), 100 rounds a second, until `stop` exists or a minute has
passed; `out` (JSON) counts the renames the kernel let through and refused, per directory."""

import json
import os
import sys
import time

out, stop, *dirs = sys.argv[1:]
if os.fork():
    os._exit(0)  # the CLI goes on; the daemon outlives it, and its relaunches
os.setsid()
counts = {d: {"renamed": 0, "refused": 0} for d in dirs}
end = time.monotonic() + 60
while not os.path.exists(stop) and time.monotonic() < end:
    for d in dirs:
        for name in os.listdir(d):
            if name.startswith("storm") or name.endswith(".x"):
                continue
            path = os.path.join(d, name)
            try:
                os.rename(path, path + ".x")
            except OSError:
                counts[d]["refused"] += 1
                continue
            counts[d]["renamed"] += 1
            try:
                os.rename(path + ".x", path)
            except OSError:
                counts[d]["refused"] += 1
    with open(out + ".new", "w") as f:
        json.dump({"pid": os.getpid(), "counts": counts}, f)
    os.replace(out + ".new", out)
    time.sleep(0.01)  # sleep-ok: the attacker's pace, 100 rounds a second
