"""The red team as the guarded CLI of a sleeve in the image (tests/e2e/test_e2e_redteam.py):
every way at the sidecar's side it tries, one JSON object of results (an errno name, or "ok").

`pod_probe.py SPEC`: SPEC (JSON) names the report, the file that says go, the sockets, the
files to read and to change, the URLs. attacks.py, egress_probe.py and secrets_probe.py, put
beside it, do their part. Standard library only: it runs as the image's unprivileged user.
"""

import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from secrets_probe import vm_read

HERE = os.path.dirname(os.path.abspath(__file__))
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
libc = ctypes.CDLL(None, use_errno=True)
with open(sys.argv[1]) as fh:
    spec = json.load(fh)
work = spec["workspace"]
results: dict[str, object] = {}


def attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def open_with(path: str, flags: int) -> None:
    os.close(os.open(path, flags | os.O_NONBLOCK, 0o600))  # writes nothing even when allowed


def ptrace(pid: int) -> str:
    if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
        libc.ptrace(PTRACE_DETACH, pid, None, None)
        return "ok"
    return errno.errorcode.get(ctypes.get_errno(), "?")


def run_shell(sock: str) -> dict[str, object]:
    """`tmux -S sock run-shell`: a command in whatever server answers there."""
    marker = os.path.join(work, "escaped-" + os.path.basename(sock))
    argv = ["tmux", "-S", sock, "run-shell", f"touch {marker}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    return {"code": done.returncode, "stderr": done.stderr.strip()[-200:],
            "escaped": os.path.exists(marker)}  # fmt: skip


def files_of(path: str) -> list[str]:
    """`path`, or a directory's files (its listing shows names only)."""
    if not os.path.isdir(path):
        return [path]
    return [os.path.join(path, entry) for entry in os.listdir(path)]


deadline = time.monotonic() + 60
while not os.path.exists(spec["go"]) and time.monotonic() < deadline:
    time.sleep(0.05)  # sleep-ok: the polling interval of a deadline wait

# The sockets by their own path, renamed and hard-linked beside it (the dir permitting), and a
# symlink to each in the workspace; tmux's command on each path.
paths: dict[str, str] = {}
for name, sock in spec["sockets"].items():
    paths[name] = sock
    results[f"{name}:rename"] = attempt(lambda s=sock: os.rename(s, s + ".moved"))
    if results[f"{name}:rename"] == "ok":
        os.rename(sock + ".moved", sock)
    results[f"{name}:link"] = attempt(lambda s=sock: os.link(s, s + ".link"))
    if results[f"{name}:link"] == "ok":
        paths[f"{name}:link"] = sock + ".link"
    symlink = os.path.join(work, f"{name}.symlink")
    results[f"{name}:symlink"] = attempt(lambda s=sock, ln=symlink: os.symlink(s, ln))
    paths[f"{name}:symlink"] = symlink
results["run_shell"] = {name: run_shell(path) for name, path in paths.items()}
# A refusal report of its own making, sent where the broker's go.
forged = json.dumps({"host": "forged.example", "port": 1, "how": "direct"}).encode()
to = spec["sockets"]["report"]
datagram = socket.AF_UNIX, socket.SOCK_DGRAM
results["forge"] = attempt(lambda: socket.socket(*datagram).sendto(forged, to))
done = subprocess.run(
    [sys.executable, os.path.join(HERE, "attacks.py"), *paths.values()],
    capture_output=True, text=True, timeout=60, check=True,
)  # fmt: skip
found = json.loads(done.stdout)
results["connect"] = {name: found.pop(f"unix{i}") for i, name in enumerate(paths)}
results["attacks"] = found

reads = [file for path in spec["read"] for file in files_of(path)]
results["read"] = {path: attempt(lambda p=path: open_with(p, os.O_RDONLY)) for path in reads}
results["write"] = {
    path: attempt(lambda p=path: open_with(p, os.O_WRONLY | os.O_CREAT)) for path in spec["write"]
}
results["workspace"] = attempt(lambda: open(os.path.join(work, "made-by-probe"), "w").close())

# Every process outside this probe's own: the sidecar's, tmux's, ttyd's, the guard's broker.
mine = {os.getpid()}
others = {}
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        continue
    others[pid] = {
        "argv": b" ".join(argv)[:100].decode(errors="replace"),
        "environ": attempt(lambda p=pid: open_with(f"/proc/{p}/environ", os.O_RDONLY)),
        "mem": attempt(lambda p=pid: open_with(f"/proc/{p}/mem", os.O_RDONLY)),
        "ptrace": ptrace(pid),
        "process_vm_readv": vm_read(pid),
    }
results["processes"] = others

# The network: through the proxy (an allowed stub, a host off the list), and around it.
egress = os.path.join(work, "egress.json")
with subprocess.Popen(
    [sys.executable, os.path.join(HERE, "egress_probe.py"), egress, *spec["urls"]]
) as proc:
    while not os.path.exists(egress) and time.monotonic() < deadline + 60:
        time.sleep(0.05)  # sleep-ok: the polling interval of a deadline wait
    proc.kill()
with open(egress) as fh:
    results["egress"] = json.load(fh)

tmp = spec["report"] + ".tmp"
with open(tmp, "w") as fh:
    json.dump(results, fh)
os.replace(tmp, spec["report"])
signal.pause()  # stays, as a CLI does
