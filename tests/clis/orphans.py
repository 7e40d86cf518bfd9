"""Makes N orphans that exit at once (grandchildren whose parent is already gone), then
writes argv[2] and waits. Without a reaping PID 1 they would stay zombies."""

import os
import signal
import sys

count = int(sys.argv[1])
for _ in range(count):
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            os._exit(0)  # the grandchild: an orphan that exits
        os._exit(0)  # the intermediate child exits first, so the grandchild is orphaned
    os.waitpid(pid, 0)
with open(sys.argv[2], "w") as fh:
    fh.write(str(count))
print(f"made {count} orphans", flush=True)
while True:
    signal.pause()
