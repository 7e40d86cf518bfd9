"""Prints to its terminal for the recording tests, then stays up:
`flood MIB` — MIB MiB of 100-character lines as fast as the pane takes them, then `FLOOD DONE`;
`mixed` — READY; once a line is typed, a clear-screen loop, invalid UTF-8, wide and combining
characters, then `MIXED DONE`;
`say TEXT` — TEXT on a line of its own."""

import sys
import time

out = sys.stdout.buffer
mode = sys.argv[1]
if mode == "flood":
    line = b"0123456789" * 9 + b"abcdefgh\r\n"
    block = line * 1024
    for _ in range(int(sys.argv[2]) * 1024 * 1024 // len(block)):
        out.write(block)
    out.write(b"FLOOD DONE\r\n")
elif mode == "mixed":
    # Only once told: what a CLI prints before the sidecar's control client attaches reaches
    # the recording as a picture of the screen, not as the bytes it wrote.
    out.write(b"READY\r\n")
    out.flush()
    sys.stdin.readline()
    for n in range(50):
        out.write(f"\x1b[2J\x1b[Hframe {n}\r\n".encode())
        out.flush()
    out.write(b"invalid: \xff\xfe\xc3 end\r\n")
    out.write("wide: 漢字カナ 🙂 combining: e\u0301 a\u0308\r\n".encode())
    out.write(b"MIXED DONE\r\n")
else:
    out.write(sys.argv[2].encode() + b"\r\n")
out.flush()
while True:
    time.sleep(3600)  # sleep-ok: a CLI that just stays up
