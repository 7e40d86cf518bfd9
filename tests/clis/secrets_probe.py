"""A CLI that hunts for the secrets' real values from where the CLI runs, then uses them the
only way it may (through the egress proxy), and writes what it found as JSON. Standard library
only (an unprivileged uid runs it).

Usage: secrets_probe.py REPORT MASKED_HEX MASK_HEX LISTED_URL UNLISTED_URL [ROOT...]
(ROOTs: where files are searched first, then the rest of /.)
The value is MASKED_HEX xor MASK_HEX: neither is the value, so this argv holds none of it. The
probe's own process is left out of the search (it holds the value it rebuilt).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

MAX_FILES = 20_000
MAX_FILE_BYTES = 1 << 20
MAX_BYTES = 512 << 20
MAX_REGION = 64 << 20
SKIP = ("/proc", "/sys", "/dev", "/usr", "/work/.cache")
ANY_ADDRESS = 0x400000  # the permission check comes before the address is looked at
libc = ctypes.CDLL(None, use_errno=True)


class IoVec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


def others() -> list[int]:
    mine = {os.getpid(), os.getppid()}  # the guard's broker is the probe's parent: its own
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in mine]


Needles = dict[str, bytes]  # what is looked for, by the name a hit is reported with


def in_proc_files(needles: Needles, report: dict[str, object]) -> list[str]:
    hits = []
    read = 0
    for pid in others():
        for name in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{pid}/{name}").read_bytes()
            except OSError:
                continue
            read += 1
            hits += [f"{k} /proc/{pid}/{name}" for k, n in needles.items() if n in data]
    report["proc_files_read"] = read
    return hits


def in_files(needles: Needles, roots: list[str], report: dict[str, object]) -> list[str]:
    """Every regular file it can open beneath `roots` (then the rest of /), bounded."""
    hits: list[str] = []
    counts = {"files": 0, "bytes": 0}
    done: set[str] = set()
    for top in roots:
        for root, dirs, files in os.walk(top, onerror=lambda _: None):
            if root.startswith(SKIP) or root in done:
                dirs[:] = []
                continue
            done.add(root)
            for name in files:
                hits += _in_file(os.path.join(root, name), needles, counts)
                if counts["files"] >= MAX_FILES or counts["bytes"] >= MAX_BYTES:
                    report["files_opened"] = counts["files"]
                    return hits
    report["files_opened"] = counts["files"]
    return hits


def _in_file(path: str, needles: Needles, counts: dict[str, int]) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return []
    try:
        if os.fstat(fd).st_mode & 0o170000 != 0o100000:
            return []
        data = os.read(fd, MAX_FILE_BYTES)
    except OSError:
        return []
    finally:
        os.close(fd)
    counts["files"] += 1
    counts["bytes"] += len(data)
    return [f"{k} {path}" for k, n in needles.items() if n in data]


def _open_error(path: str) -> str:
    """ "ok" when `path` opens for reading, else the errno's name."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "ok"


def regions(pid: int) -> list[tuple[int, int]]:
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        span, perms = line.split()[:2]
        if perms.startswith("r"):
            start, end = (int(x, 16) for x in span.split("-"))
            out.append((start, min(end, start + MAX_REGION)))
    return out


def vm_read(pid: int) -> str:
    """What process_vm_readv of one page of `pid` gives: "ok", or an errno name (EPERM: not
    allowed; EFAULT: allowed, nothing mapped there)."""
    buf = ctypes.create_string_buffer(4096)
    local = IoVec(ctypes.cast(buf, ctypes.c_void_p), 4096)
    remote = IoVec(ANY_ADDRESS, 4096)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    done = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return "ok" if done >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")


def in_memory(needles: Needles, report: dict[str, object]) -> list[str]:
    hits = []
    read_pids = []
    for pid in others():
        try:
            spans = regions(pid)
            mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
        except OSError:
            continue
        read_pids.append(pid)
        try:
            for start, end in spans:
                try:
                    data = os.pread(mem, end - start, start)
                except OSError:
                    continue
                hits += [f"{k} /proc/{pid}/mem" for k, n in needles.items() if n in data]
        finally:
            os.close(mem)
    report["memory_read_pids"] = read_pids
    report["process_vm_readv"] = {pid: vm_read(pid) for pid in others()}
    return hits


def fetch(url: str, key: str) -> str:
    request = urllib.request.Request(url, headers={"x-api-key": key})
    with urllib.request.urlopen(request, timeout=10) as answer:  # through HTTP_PROXY
        return str(answer.read().decode())


def main() -> None:
    report_path, masked, mask, listed, unlisted, *roots = sys.argv[1:]
    value = bytes(a ^ b for a, b in zip(bytes.fromhex(masked), bytes.fromhex(mask), strict=True))
    placeholder = os.environ["API_KEY"]
    report: dict[str, object] = {"env": dict(os.environ), "uid": os.getuid()}
    # A child of its own, holding the placeholder: proof that the search reads what it may
    # (its environ, its memory) where the value would be found.
    # It says when it runs: Popen returns once the child has begun its exec, and the kernel
    # sets the new image's environment (what /proc/PID/environ shows) a moment later.
    child = subprocess.Popen(
        [sys.executable, "-c", "print(flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    child.stdout.readline()
    needles = {"value": value, "placeholder": placeholder.encode()}
    hits = (
        in_proc_files(needles, report)
        + in_memory(needles, report)
        + in_files(needles, [*roots, "/"], report)
    )
    child.kill()
    child.wait()
    report["value_hits"] = [h for h in hits if h.startswith("value ")]
    # The key of the sleeve's CA (the proxy signs certificates for the secrets' hosts with it).
    report["ca_key"] = {root: _open_error(f"{root}/state/egress-ca/ca.key") for root in roots}
    report["placeholder_hits"] = [h for h in hits if str(child.pid) in h]
    # The far end echoes the key it got: the real value from the listed host (kept out of the
    # report: it is a file), the placeholder from the other.
    echoed = fetch(listed, placeholder)
    report["listed_got_value"] = echoed == value.decode()
    report["unlisted"] = fetch(unlisted, placeholder)
    Path(report_path).write_text(json.dumps(report))
    # Tricked into showing what the listed host echoed: the recording must not keep it.
    print(f"echoed: {echoed}", flush=True)
    sys.stdin.read()  # stay, as a CLI does


if __name__ == "__main__":
    main()
