"""A CLI that looks for secrets wherever its user can look: every /proc/*/environ and
/proc/*/cmdline, every file it can read under the given roots, and the given secret files.

`snoop.py REPORT GO NEEDLES_HEX ROOTS_JSON FILES_JSON`: waits for the file GO (the test makes it
once terminals are open), scans, writes REPORT (JSON), makes a file and a directory of its own
next to the report, then waits for a signal. The needles arrive hex-encoded, so that this
process's own argv does not hold them (it would find itself). Standard library only: it runs
as an unprivileged user with the system's python3.
"""

import json
import os
import signal
import stat
import sys
import time

report_path, go_path, needles_hex, roots_json, files_json = sys.argv[1:6]
needles = [bytes.fromhex(n) for n in needles_hex.split(",")]
READ_LIMIT = 4 * 1024 * 1024

deadline = time.monotonic() + 30
while not os.path.exists(go_path) and time.monotonic() < deadline:
    time.sleep(0.02)  # sleep-ok: the polling interval of a deadline wait


def hits(data: bytes) -> list[int]:
    return [i for i, needle in enumerate(needles) if needle in data]


found: list[dict[str, object]] = []
procs = files = 0
ttyds: dict[int, bool] = {}  # this sleeve's ttyd: has it a credential in its argv?
me = os.getpid()
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == me:
        continue
    for what in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        procs += what == "cmdline"
        # A ttyd of this sleeve (its argv names the state dir, the first root) with a
        # credential in its argv. (Other sidecars on a shared test machine may run one.)
        ours = json.loads(roots_json)[0].encode() in data
        if what == "cmdline" and ours and b"ttyd" in data.split(b"\0")[0]:
            ttyds[int(pid)] = b"--credential" in data
        for i in hits(data):
            found.append({"where": f"/proc/{pid}/{what}", "needle": i})


def scan_file(path: str) -> None:
    global files
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        data = os.read(fd, READ_LIMIT)
    except OSError:
        return
    finally:
        os.close(fd)
    files += 1
    for i in hits(data):
        found.append({"where": path, "needle": i})


for root in json.loads(roots_json):
    scan_file(root)
    for top, _dirs, names in os.walk(root):
        for name in names:
            scan_file(os.path.join(top, name))

secret_files = {}
for path in json.loads(files_json):
    try:
        with open(path, "rb") as fh:
            fh.read(1)
        secret_files[path] = "read"
    except OSError as exc:
        secret_files[path] = type(exc).__name__

here = os.path.dirname(report_path)
with open(os.path.join(here, "made-by-cli.txt"), "w") as fh:
    fh.write("mine\n")
os.makedirs(os.path.join(here, "made-by-cli-dir"), exist_ok=True)
report = {
    "uid": os.getuid(),
    "euid": os.geteuid(),
    "groups": os.getgroups(),
    "home": os.environ.get("HOME"),
    "found": found,
    "procs": procs,
    "files": files,
    "ttyds": ttyds,
    "secret_files": secret_files,
}
with open(report_path + ".tmp", "w") as fh:
    json.dump(report, fh)
os.replace(report_path + ".tmp", report_path)
print("snoop done", flush=True)
while True:
    signal.pause()
