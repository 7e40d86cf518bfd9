"""A line-oriented CLI with a prompt, for the inbox-notice and activity tests: every line it reads
is appended to the log file named by argv[1]; `work N` prints a line every 0.2 s for N seconds."""

import sys
import time

with open(sys.argv[1], "a", encoding="utf-8") as log:
    print("ready> ", end="", flush=True)
    for line in sys.stdin:
        log.write(line)
        log.flush()
        if line.startswith("work "):
            end = time.monotonic() + float(line.split()[1])
            while time.monotonic() < end:
                print("working...", flush=True)
                time.sleep(0.2)  # sleep-ok: the CLI's own pace of output
        print("ready> ", end="", flush=True)
