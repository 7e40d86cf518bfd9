"""The toy CLI itself (run by its file): a prompt `toy> ` that takes typed lines, hooks that
report through the sidecar's relay, a permission dialog answered by typing 1, 2 or 3, and a
conversation id it resumes with `--resume ID`. Each start and each command it runs is appended
as a JSON line to $TOY_LOG (when set).

    toy.py [--continue | --resume ID] --hooks SETTINGS
"""

import json
import os
import shlex
import subprocess
import sys
import uuid


def log(**record: object) -> None:
    path = os.environ.get("TOY_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")


def main(argv: list[str]) -> None:
    args = argv[1:]
    settings = args[args.index("--hooks") + 1] if "--hooks" in args else None
    session = args[args.index("--resume") + 1] if "--resume" in args else str(uuid.uuid4())
    commands: dict[str, str] = {}
    if settings is not None:
        with open(settings, encoding="utf-8") as fh:
            commands = json.load(fh)["hooks"]
    log(argv=args, session=session)

    def hook(event: str, **payload: object) -> None:
        """Run our hook command for `event` (the sidecar's relay), its input on stdin."""
        if event in commands:
            body = json.dumps({"session_id": session, **payload})
            subprocess.run(shlex.split(commands[event]), input=body, text=True, check=False)

    print(f"toy: {'resumed' if '--resume' in args else 'new conversation'} {session}")
    print("toy> ", end="", flush=True)  # drawn before its hook reports: the screen agrees
    hook("Start")
    for line in sys.stdin:
        text = line.strip()
        print("working", end="", flush=True)  # the cursor stays on this line while it works
        hook("Prompt", prompt=text)
        if text.startswith("run "):
            command = text.removeprefix("run ")
            print(f"\nAllow toy to run: {command}?")
            print("  1. Yes\n  2. Yes, and don't ask again\n  3. No")
            print("choice> ", end="", flush=True)
            hook("Ask", command=command)
            choice = sys.stdin.readline().strip()
            allowed = choice in ("1", "2")
            log(command=command, choice=choice, allowed=allowed)
            print(f"ran {command}" if allowed else f"did not run {command}")
        else:
            print(f"\necho: {text}")
        print("toy> ", end="", flush=True)
        hook("Done")


if __name__ == "__main__":
    main(sys.argv)
