"""A CLI with an input prompt and a dialog, for the screen-aware state tests (no hooks: the
`activity` source). `ask` draws a yes/no question and waits for its answer; `menu` draws a
numbered choice; `spin N` paints a spinner in place for N seconds; `redraw N` clears and redraws
the screen in a loop for N seconds. Every line read is appended to the log file argv[1]."""

import sys
import time

PROMPT = "ready> "


def paced(seconds: float, draw) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        draw(n)
        n += 1
        time.sleep(0.1)  # sleep-ok: the CLI's own pace of painting


with open(sys.argv[1], "a", encoding="utf-8") as log:
    print(PROMPT, end="", flush=True)
    for line in sys.stdin:
        log.write(line)
        log.flush()
        words = line.split()
        if words[:1] == ["ask"]:
            print("Delete the build directory? [y/N] ", end="", flush=True)
            answer = sys.stdin.readline()
            log.write(f"answer {answer}")
            log.flush()
            print(f"answered {answer.strip() or 'N'}")
        elif words[:1] == ["menu"]:
            print("Pick a theme\n❯ 1. Dark\n  2. Light\n  3. Auto", flush=True)
            choice = sys.stdin.readline()
            print(f"chose {choice.strip()}")
        elif words[:1] == ["spin"]:
            paced(
                float(words[1]),
                lambda n: print("\r" + "|/-\\"[n % 4] + " thinking", end="", flush=True),
            )
            print()
        elif words[:1] == ["redraw"]:
            paced(float(words[1]), lambda n: print(f"\x1b[2J\x1b[Hframe {n}", end="", flush=True))
            print()
        print(PROMPT, end="", flush=True)
