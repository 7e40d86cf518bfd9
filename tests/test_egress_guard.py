"""The egress guard from the guarded side: real processes (Python, sh, node, curl, tmux, the real
Claude Code) try every way out; only the allowed loopback address answers. Loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sidecar.egress.guard import MISSING, guard_argv, self_test
from sidecar.egress.reports import ReportListener
from tests.agenttools import claude_binary
from tests.harness import wait_for, wait_for_async
from tests.tools import SYSTEM_PYTHON

PROBE = Path(__file__).resolve().parent / "egress_probe.py"
NOBODY = 65534

# What each bypass gets under the guard (tests/egress_probe.py names them).
REFUSED = {
    "other_address": "EACCES",  # the allowed port on 127.0.0.2: another listener
    "other_port": "EACCES",
    "udp": "EACCES",  # DNS included: a resolver needs a UDP socket
    "ipv6": "EAFNOSUPPORT",
    "ipv6_loopback": "EAFNOSUPPORT",
    "raw": "EACCES",
    "icmp_dgram": "EACCES",
    "packet": "EAFNOSUPPORT",
    "netlink_generic": "EAFNOSUPPORT",
    "netlink_netfilter": "EAFNOSUPPORT",
    "sctp": "EACCES",
    "mptcp": "EACCES",
    "io_uring": "ENOSYS",
    "tfo_sendto": "ENOTSUP",
    "tfo_sendmsg": "ENOTSUP",
    "tfo_option": "ENOPROTOOPT",
    "unix_dgram": "EACCES",
    "abstract": "EACCES",
    "x32": "ENOSYS",
    "nested_listener": "EPERM",
    "i386": "killed by SIGSYS",
}


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def allowed() -> Iterator[int]:
    with echo_server() as port:
        yield port


@pytest.fixture
def forbidden() -> Iterator[int]:
    with echo_server() as port:
        yield port


@pytest.fixture
def abstract() -> Iterator[str]:
    """An abstract unix socket made outside the guard."""
    name = f"egress-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind("\0" + name)
        s.listen()
        yield name


def guarded(argv: Sequence[str], port: int, **kw: object) -> tuple[str, ...]:
    return guard_argv(argv, [("127.0.0.1", port)], kw.pop("report", None), **kw)  # type: ignore[arg-type]


def probe(argv: Sequence[str], **kw: object) -> dict[str, str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_every_bypass_fails_and_the_allowed_address_answers(
    allowed: int, forbidden: int, abstract: str
) -> None:
    args = [str(PROBE), str(allowed), str(forbidden), abstract]
    # Unguarded, the same probe gets out: the refusals below are the guard's.
    free = probe([sys.executable, *args])
    assert free["other_port"] == free["udp"] == free["ipv6"] == free["abstract"] == "ok"
    assert free["tfo_option"] == free["unix_dgram"] == free["nested_listener"] == "ok"
    results = probe(guarded([sys.executable, *args], allowed))
    assert results["allowed"] == results["allowed_nonblocking"] == "ok"
    assert results["netlink_route"] == "ok"  # getaddrinfo and getifaddrs read it
    assert {k: results[k] for k in REFUSED} == REFUSED


def test_another_uid_is_guarded_the_same(
    allowed: int, forbidden: int, abstract: str, tmp_path: Path
) -> None:
    """As uid 65534 with the system's Python: nothing of the guard needs root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run as another uid")
    args = [str(PROBE), str(allowed), str(forbidden), abstract]
    argv = guarded([SYSTEM_PYTHON, *args], allowed)
    results = probe([SYSTEM_PYTHON, *argv[1:]], user=NOBODY, group=NOBODY, cwd="/")
    assert results["allowed"] == results["allowed_nonblocking"] == "ok"
    assert {k: results[k] for k in REFUSED} == REFUSED


def test_a_child_of_a_child_is_guarded(allowed: int) -> None:
    script = (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {allowed})).close()\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.2', {allowed}))\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    inner = f'{sys.executable} -c "$1" &\nwait'
    argv = guarded(["sh", "-c", f"sh -c '{inner}' sh \"$1\"", "sh", script], allowed)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert (done.returncode, done.stdout) == (0, "refused\n"), done.stderr


def test_node_connects_non_blocking_through_the_broker(allowed: int) -> None:
    node = "/usr/bin/node"
    if not os.path.exists(node):
        pytest.skip("node is not installed")
    script = (
        "const net = require('net');"
        f"const s = net.connect({allowed}, '127.0.0.1', () => s.write('ping'));"
        "s.on('data', d => { console.log(String(d)); s.end(); });"
        "const t = net.connect(" + str(allowed) + ", '127.0.0.2');"
        "t.on('error', e => console.log(e.code));"
    )
    done = subprocess.run(
        guarded([node, "-e", script], allowed), capture_output=True, text=True, timeout=30
    )
    assert sorted(done.stdout.split()) == ["EACCES", "ping"], done.stderr


class _Proxy(socketserver.BaseRequestHandler):
    """An HTTP proxy stand-in: answers any request line with 200 and names what it was asked."""

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head and (chunk := self.request.recv(4096)):
            head += chunk
        body = head.split(b"\r\n", 1)[0]
        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


def test_curl_reaches_the_allowed_proxy_and_nothing_else() -> None:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        curl = ["curl", "-sS", "--max-time", "10"]
        via = [*curl, "-x", f"http://127.0.0.1:{port}", "http://example.invalid/x"]
        done = subprocess.run(guarded(via, port), capture_output=True, text=True, timeout=30)
        assert done.stdout == "GET http://example.invalid/x HTTP/1.1", done.stderr
        direct = [*curl, f"http://127.0.0.2:{port}/"]
        done = subprocess.run(guarded(direct, port), capture_output=True, text=True, timeout=30)
        assert done.returncode == 7 and "127.0.0.2" in done.stderr  # curl: couldn't connect
    finally:
        server.shutdown()
        server.server_close()


def test_the_sidecars_tmux_is_out_of_reach_and_an_own_tmux_works(
    allowed: int, tmp_path: Path
) -> None:
    """`tmux -S <the sidecar's socket> new-window` would run a command outside the guard."""
    sock, own, marker = tmp_path / "sidecar.sock", tmp_path / "own.sock", tmp_path / "escaped"
    tmux = ["tmux", "-f", "/dev/null"]
    subprocess.run([*tmux, "-S", str(sock), "new-session", "-d", "sleep 60"], check=True)
    try:
        attempt = [*tmux, "-S", str(sock), "new-window", f"touch {marker}"]
        done = subprocess.run(
            guarded(attempt, allowed, deny_unix=[sock]), capture_output=True, text=True, timeout=30
        )
        assert done.returncode != 0 and not marker.exists(), done.stderr
        # Its own server (started inside, so guarded) is reachable.
        script = (
            f"tmux -f /dev/null -S {own} new-session -d 'sleep 60' && "
            f"tmux -S {own} list-sessions && tmux -S {own} kill-server"
        )
        done = subprocess.run(
            guarded(["sh", "-c", script], allowed, deny_unix=[sock]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0 and "1 windows" in done.stdout, done.stderr
        # And the sidecar's tmux itself still works.
        subprocess.run([*tmux, "-S", str(sock), "new-window", f"touch {marker}"], check=True)
        wait_for(marker.exists, what="the sidecar's own tmux to run its window")
    finally:
        subprocess.run([*tmux, "-S", str(sock), "kill-server"], check=False)


def test_killing_the_broker_closes_the_network(allowed: int, tmp_path: Path) -> None:
    """Fail closed: the CLI dies with its broker, and what it started can connect nowhere."""
    out = tmp_path / "after"
    script = (
        "import os, signal, socket, sys, time\n"
        "parent = os.getpid()\n"
        "if os.fork() == 0:\n"
        "    while os.getppid() == parent:  # polls for the parent's end\n"
        "        time.sleep(0.01)  # sleep-ok\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {allowed})); r = 'connected'\n"
        "    except OSError as e: r = str(e.errno)\n"
        f"    open({str(out)!r}, 'w').write(r); os._exit(0)\n"
        "print('ready', flush=True); signal.pause()\n"
    )
    argv = guarded([sys.executable, "-c", script], allowed)
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as broker:
        assert broker.stdout is not None and broker.stdout.readline() == b"ready\n"
        broker.kill()
    result = wait_for(lambda: out.exists() and out.read_text(), what="the grandchild's try")
    assert result == str(errno.ENOSYS)  # no listener left to ask


async def test_refusals_are_reported(allowed: int, tmp_path: Path) -> None:
    denied: list[tuple[str, int, str]] = []
    path = tmp_path / "report.sock"
    hows = ("direct", "udp", "ipv6")
    transport = ReportListener.open(
        path, lambda *d: denied.append(d), sender=lambda pid, uid: True, hows=hows
    )
    try:
        script = (
            "import socket\n"
            f"for make in (lambda: socket.create_connection(('127.0.0.2', {allowed})),\n"
            "             lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM),\n"
            "             lambda: socket.socket(socket.AF_INET6)):\n"
            "    try: make()\n"
            "    except OSError: pass\n"
        )
        proc = await asyncio.create_subprocess_exec(
            *guarded([sys.executable, "-c", script], allowed, report=path)
        )
        assert await proc.wait() == 0
        await wait_for_async(lambda: len(denied) >= 3, what="three reports")
        assert denied == [("127.0.0.2", allowed, "direct"), ("", 0, "udp"), ("", 0, "ipv6")]
    finally:
        transport.close()


def test_exit_status_and_forwarded_signals(allowed: int) -> None:
    done = subprocess.run(guarded(["sh", "-c", "exit 7"], allowed), timeout=30)
    assert done.returncode == 7
    script = "import signal\nprint('ready', flush=True)\nsignal.pause()\n"
    argv = guarded([sys.executable, "-c", script], allowed)
    with subprocess.Popen(argv, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)  # to the broker alone: the CLI gets it and ends by it
        assert proc.wait(timeout=30) == -signal.SIGTERM


def test_the_self_test_passes_and_a_guard_inside_a_guard_cannot_start(allowed: int) -> None:
    assert self_test([("127.0.0.1", allowed)]) is None
    # Inside the guard no seccomp listener can be made: the inner guard says so and exits 2.
    inner = guarded(["true"], allowed)
    done = subprocess.run(guarded(inner, allowed), capture_output=True, text=True, timeout=30)
    assert done.returncode == MISSING
    assert "seccomp user notification" in done.stderr


def test_the_real_claude_code_runs_guarded(allowed: int) -> None:
    claude = claude_binary()
    done = subprocess.run(
        guarded([str(claude), "--version"], allowed), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "Claude Code" in done.stdout, done.stderr
