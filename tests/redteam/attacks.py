"""What the agent tries from inside the guard, one JSON object of results on stdout (an errno
name, or "ok"): the socket kinds the broker never sees, IP options, the resolver's files, a
connect to each unix socket path given in argv, and its own capabilities."""

import errno
import json
import os
import socket
import sys
from collections.abc import Callable

LSRR = bytes([0x83, 7, 4, 127, 0, 0, 2, 0])  # loose source route through 127.0.0.2, padded
RESOLVER = ("/etc/hosts", "/etc/resolv.conf", "/etc/nsswitch.conf")
results: dict[str, object] = {}


def attempt(name: str, action: Callable[[], object]) -> None:
    try:
        action()
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    else:
        results[name] = "ok"


def with_option(level: int, option: int, value: bytes) -> None:
    with socket.socket() as s:
        s.setsockopt(level, option, value)


def connect(path: str) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)


def open_for_writing(path: str) -> None:
    os.close(os.open(path, os.O_WRONLY | os.O_APPEND))  # writes nothing even when allowed


attempt("unix_raw", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_RAW).close())
attempt("unix_dgram", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).close())
attempt("pair_dgram", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))
attempt("pair_stream", lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("ip_options", lambda: with_option(socket.IPPROTO_IP, socket.IP_OPTIONS, LSRR))
attempt("bind_to_device", lambda: with_option(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo"))
for path in RESOLVER:
    if os.path.exists(path):
        attempt(path, lambda path=path: open_for_writing(path))
for i, path in enumerate(sys.argv[1:]):
    attempt(f"unix{i}", lambda path=path: connect(path))
with open("/proc/self/status") as f:
    status = dict(line.split(":\t", 1) for line in f if ":\t" in line)
results["status"] = {k: status[k].strip() for k in ("CapEff", "CapBnd", "CapAmb", "NoNewPrivs")}
print(json.dumps(results))
