"""Prints a line, appends its pid to argv[2] (if given), and exits with code argv[1]."""

import os
import sys

print(f"exit_with {sys.argv[1]} pid {os.getpid()}", flush=True)
if len(sys.argv) > 2:
    with open(sys.argv[2], "a") as fh:
        fh.write(f"{os.getpid()}\n")
sys.exit(int(sys.argv[1]))
