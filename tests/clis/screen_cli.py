"""Draws a known screen and waits, for the /screen tests. `marker TEXT`: a blank line, TEXT and a
prompt `ready> ` (the cursor after it). `wide`: all 50 rows of the 200-column pane filled with
wide CJK characters and combining accents (`wide_line`), each row placed by a cursor move so
that nothing scrolls; the cursor then goes to row 3, column 10. `exit`: the marker, then exit 0.
"""

import signal
import sys

ROWS = 50


def wide_line(row: int) -> str:
    """199 columns: `NN ` (3), 96 wide characters (192), `cafe` with a combining acute (4)."""
    return f"{row:02d} " + "漢字かな" * 24 + "cafe\u0301"


def main() -> None:
    mode = sys.argv[1]
    if mode == "wide":
        text = "\x1b[2J" + "".join(f"\x1b[{r + 1};1H{wide_line(r)}" for r in range(ROWS))
        text += "\x1b[4;11H"
    else:
        text = f"\n{sys.argv[2]}\nready> "
    sys.stdout.buffer.write(text.encode())  # UTF-8 whatever the locale
    sys.stdout.flush()
    if mode != "exit":
        signal.pause()  # waits like a CLI at its prompt, with no output and no child


if __name__ == "__main__":
    main()
