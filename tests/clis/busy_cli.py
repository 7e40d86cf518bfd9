"""A CLI that reads its input the way a busy TUI does: in raw mode, in one go every BUSY
seconds, drawing what it read. Like Gemini CLI, it takes an Enter read within GUARD of typed
text as a newline, not a submission, and logs each line it got as `submitted <line>` or
`newline <text so far>` to the file named by its argument."""

from __future__ import annotations

import os
import sys
import termios
import time
import tty
from pathlib import Path

BUSY = 0.6  # a busy event loop: input waits this long to be read
GUARD = 0.03  # an Enter this soon after typed text is a newline (Gemini CLI 0.61's: 40 ms)

log = Path(sys.argv[1])
fd = sys.stdin.fileno()
saved = termios.tcgetattr(fd)
tty.setraw(fd)
os.set_blocking(fd, False)
line, typed_at = "", 0.0
sys.stdout.write("busy> ")
sys.stdout.flush()
try:
    while True:
        time.sleep(BUSY)  # sleep-ok: the busy loop this program stands for
        try:
            chunk = os.read(fd, 65536).decode(errors="replace")
        except BlockingIOError:
            continue
        now = time.monotonic()
        for ch in chunk.replace("\x1b[200~", "").replace("\x1b[201~", ""):
            if ch == "\r":
                outcome = "newline" if now - typed_at < GUARD else "submitted"
                with log.open("a") as fh:
                    fh.write(f"{outcome} {line}\n")
                if outcome == "submitted":
                    line = ""
                    sys.stdout.write("\r\nbusy> ")
                else:
                    line += " "
            else:
                line += ch
                typed_at = now
                sys.stdout.write(ch)
        sys.stdout.flush()
finally:
    termios.tcsetattr(fd, termios.TCSADRAIN, saved)
