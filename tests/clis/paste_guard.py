"""A stand-in for Gemini CLI's input prompt, for the test of a prompt's submission: it draws the
prompt as Gemini 0.61 does (a rule, a mode line, " > "), takes a bracketed paste, and runs the
hooks of the settings file Gemini reads (GEMINI_CLI_SYSTEM_DEFAULTS_PATH, when given) as Gemini
does: each command with the event's JSON on its standard input, waited for. With `guard`, the
first Enter after a paste is a newline, not a submission, as Gemini's guard after a paste makes
it when the Enter comes before the guard's timer has run (a busy machine). With `hooks`, that
newline is
followed by 1.5 s of a hooks line over the prompt, as Gemini shows while its SessionStart hooks
run (an Enter then is a newline too). Every Enter and Tab it reads is appended to the log file
(argv[1]) as a JSON line: {"key": "newline" | "empty" | "submit" | "tab", "text": ...}.

    paste_guard.py LOG guard|hooks|plain
"""

import json
import os
import select
import subprocess
import sys
import time
import tty
import uuid

LOG, MODE = sys.argv[1], sys.argv[2]
SESSION = str(uuid.uuid4())
PASTE_START, PASTE_END = b"\x1b[200~", b"\x1b[201~"
transcript: list[str] = []
buffer = ""
guarded = False
HOOKS_FOR = 1.5
busy_until: float | None = None  # the hooks line is up until then


def hook(event: str) -> None:
    path = os.environ.get("GEMINI_CLI_SYSTEM_DEFAULTS_PATH")
    if path is None:
        return  # run without the sidecar's hooks
    with open(path, encoding="utf-8") as f:
        settings = json.load(f)
    payload = json.dumps({"session_id": SESSION, "hook_event_name": event, "cwd": os.getcwd()})
    for entry in settings["hooks"].get(event, []):
        for one in entry["hooks"]:
            subprocess.run(one["command"], shell=True, input=payload.encode(), check=False)


def log(key: str, text: str = "") -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"key": key, "text": text}) + "\n")


def draw(spinner: str | None = None) -> None:
    lines = [*transcript[-5:]]
    if spinner is not None:
        lines.append(spinner)
    lines += ["─" * 60, " Shift+Tab to accept edits", ""]
    typed = buffer.split("\n")
    lines += [" > " + typed[0], *("   " + more for more in typed[1:])]
    out = "\x1b[H\x1b[2J" + "\r\n".join(lines)
    if not buffer:  # Gemini's placeholder, the cursor before it
        out += f"  Type your message or @path/to/file\x1b[{len(lines)};4H"
    os.write(1, out.encode())


def enter() -> None:
    global buffer, guarded
    if not buffer.strip():
        log("empty")
        return
    if guarded or busy_until is not None:
        guarded = False
        buffer += "\n"
        log("newline", buffer)
        if MODE == "hooks" and busy_until is None:
            start_hooks()
        else:
            draw()
        return
    text, buffer = buffer, ""
    log("submit", text)
    hook("BeforeAgent")
    draw("⠴ Thinking... (esc to cancel, 0s)")
    transcript.append(f" > {' '.join(text.split())}")
    hook("AfterAgent")
    draw()


def start_hooks() -> None:
    global busy_until
    busy_until = time.monotonic() + HOOKS_FOR
    draw("⠴ Executing Hooks: sidecar")


def main() -> None:
    global buffer, guarded, busy_until
    tty.setraw(0)
    os.write(1, b"\x1b[?2004h")  # bracketed paste, as Gemini asks for it
    draw()
    hook("SessionStart")
    pending = b""
    while True:
        wait = None if busy_until is None else max(busy_until - time.monotonic(), 0)
        if not select.select([0], [], [], wait)[0]:
            busy_until = None  # the hooks are done: the prompt is back
            draw()
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            break
        pending += chunk
        while pending:
            if PASTE_START.startswith(pending):
                break  # the start of a paste, still coming
            if pending.startswith(PASTE_START):
                end = pending.find(PASTE_END)
                if end < 0:
                    break  # the rest of the paste is still coming
                buffer += pending[len(PASTE_START) : end].decode()
                guarded = MODE in ("guard", "hooks")
                pending = pending[end + len(PASTE_END) :]
                draw()
                continue
            key, pending = pending[:1], pending[1:]
            if key == b"\r":
                enter()
            elif key == b"\t":
                log("tab")


main()
