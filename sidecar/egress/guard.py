"""Runs the CLI with its network closed but for a few loopback addresses (the egress proxy, the
sidecar's API): `python -I -m sidecar.egress.guard --allow 127.0.0.1:P ... -- ARGV`.

Without privilege, so the same in Docker, bubblewrap and a restricted pod: the wrapper forks;
the child sets no_new_privs, drops every capability (a root CLI keeps root's file access),
applies Landlock (TCP connect to the allowed ports only; abstract unix sockets and signals
scoped; the files of `sidecar.egress.fence` out of reach) and the seccomp filter of
`sidecar.security.seccomp`, hands the filter's listener to the parent and execs ARGV with the
CLI's own variables (`--env-file`: they reach nothing outside the guard). The parent stays as
the broker (`sidecar.egress.broker`), the CLI's parent, under a filter of its own: it decides
every connect, forwards the signals sent to it alone, and exits as the CLI did. The broker
dying closes the listener, and from then on the CLI's connects fail (ENOSYS): fail closed.

Choices against the first design: the broker connects the CLI's own TCP socket (pidfd_getfd)
rather than a new one put in its place, so options set before connect (curl's TCP_NODELAY) and
epoll registrations stay; TCP bind is left open (a dev server may listen; listening is not
egress); unix datagram sockets are refused (a sendmsg address is out of seccomp's sight); a
nested seccomp listener is refused (it would get connect() before the broker and could let it
pass). The supervisor tracks the broker as the CLI's pid: stopping the tree reaches both, the
exit status passes through, and terminal signals (Ctrl-C, SIGWINCH) reach the CLI directly.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from sidecar.core import env_file
from sidecar.core.files import read_regular
from sidecar.egress.broker import Broker
from sidecar.egress.fence import RESOLVER_FILES, Fence
from sidecar.security import caps, landlock
from sidecar.security import seccomp as sf
from sidecar.security.users import User, spawn_credentials

MISSING = 2  # exit status: the guard cannot hold here
PR_SET_PDEATHSIG = 1
SFD_FLAGS = os.O_CLOEXEC | os.O_NONBLOCK
MAX_ENV_FILE = 1 << 20
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGWINCH, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)  # fmt: skip
# `python -I` ignores PYTHONPATH and the user's site: the CLI's environment cannot put code
# into the broker. The sidecar package that builds the argv is the one that runs it.
BOOT = (
    "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
    "runpy.run_module('sidecar.egress.guard', run_name='__main__', alter_sys=True)"
)
_libc = ctypes.CDLL(None, use_errno=True)


def guard_argv(
    argv: Sequence[str],
    allowed: Sequence[tuple[str, int]],
    report: Path | None,
    *,
    deny_unix: Sequence[Path] = (),
    fence: Fence | None = None,
    env_file: Path | None = None,
) -> tuple[str, ...]:
    """The argv that runs `argv` guarded: connects only to `allowed` (IPv4, port), none to the
    unix sockets `deny_unix` (the sidecar's tmux and ttyd) or to any listener outside the
    guard, refusals told to `report`, the files of `fence` out of reach, the variables in
    `env_file` given to `argv` alone."""
    root = str(Path(__file__).resolve().parents[2])
    out = [sys.executable, "-I", "-c", BOOT, root]
    for host, port in allowed:
        out += ["--allow", f"{host}:{port}"]
    for path in deny_unix:
        out += ["--deny-unix", str(path)]
    if report is not None:
        out += ["--report", str(report)]
    if fence is not None:
        out += fence.argv()
    if env_file is not None:
        out += ["--env-file", str(env_file)]
    return (*out, "--", *argv)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    socket.inet_aton(host)  # IPv4 literals only: the broker compares addresses, not names
    if host.count(".") != 3 or not 0 < int(port) < 65536:
        raise ValueError(text)
    return host, int(port)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="egress_guard", description=__doc__.splitlines()[0])
    p.add_argument("--allow", action="append", type=_address, default=[], metavar="IP:PORT")
    p.add_argument("--deny-unix", action="append", default=[], metavar="PATH")
    p.add_argument("--report", metavar="PATH")
    for flag in ("--no-access", "--no-write", "--write-only"):
        p.add_argument(flag, action="append", default=[], metavar="PATH")
    p.add_argument("--env-file", metavar="PATH", help="the CLI's own variables (NAME=VALUE)")
    p.add_argument("--check", action="store_true", help="run the self-test instead of ARGV")
    p.add_argument("--probe", type=_address, help=argparse.SUPPRESS)
    p.add_argument("argv", nargs="*")
    return p


def main(args: Sequence[str] | None = None) -> None:
    opts = _parser().parse_args(args)
    if opts.probe is not None:
        sys.exit(_probe(opts.probe))
    argv = list(opts.argv)
    if opts.check:
        if not opts.allow:
            sys.exit("egress_guard: --check needs an --allow address to try")
        root = str(Path(__file__).resolve().parents[2])
        host, port = opts.allow[0]
        argv = [sys.executable, "-I", "-c", BOOT, root, "--probe", f"{host}:{port}"]
    if not argv:
        sys.exit("egress_guard: no command given (after --)")
    version = landlock.abi()
    if version < landlock.NET_ABI:
        _missing(f"Landlock ABI {version} < {landlock.NET_ABI} (TCP connect rules)")
    fence = Fence.of_args(opts.no_access, opts.no_write, opts.write_only)
    env = _cli_env(opts.env_file) if opts.env_file else {}
    status = run(argv, opts.allow, opts.deny_unix, opts.report, version, fence=fence, env=env)
    _exit_like(status)


def _cli_env(path: str) -> dict[str, str]:
    """The CLI's own variables, read once here (the file is the sidecar's, in a directory the
    CLI can change nothing in); a file that is missing or not a regular one is a refusal."""
    data = read_regular(Path(path), MAX_ENV_FILE)
    if data is None:
        _missing(f"--env-file {path} is not a regular file it can read")
    return env_file.parse(data.decode("utf-8", "surrogateescape"))


def _missing(what: str) -> NoReturn:
    print(f"egress_guard: cannot close the network: {what}", file=sys.stderr, flush=True)
    sys.exit(MISSING)


def run(
    argv: Sequence[str],
    allowed: Sequence[tuple[str, int]],
    deny_unix: Sequence[str],
    report: str | None,
    version: int,
    *,
    fence: Fence | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Start `argv` guarded, broker its connects until it exits; its wait status."""
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        child = _Child(
            argv,
            parent=parent,
            ports={port for _, port in allowed},
            version=version,
            fence=fence or Fence(),
            env={**os.environ, **(env or {})},
        )
        child.run(theirs, old_mask)
    theirs.close()
    child_fd = os.pidfd_open(pid)
    msg, fds, _flags, _addr = socket.recv_fds(ours, 512, 1)
    ours.close()
    if not fds:
        os.waitpid(pid, 0)
        _missing(msg.decode(errors="replace") or "the guarded child died while starting")
    broker = Broker(fds[0], allowed, deny_unix, report)
    try:
        sf.confine_broker()
    except OSError as exc:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _missing(f"the broker's own filter: {exc.strerror or exc}")
    return _serve(broker, pid, child_fd)


class _Child:
    """The forked child: closes the network and the fenced files, hands the listener over,
    becomes the CLI with `env`."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        parent: int,
        ports: set[int],
        version: int,
        fence: Fence,
        env: dict[str, str],
    ) -> None:
        self.argv = list(argv)
        self.parent = parent
        self.ports = ports
        self.version = version
        self.fence = fence
        self.env = env

    def run(self, sock: socket.socket, old_mask: set[int]) -> None:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; exec keeps it
                signal.signal(sig, signal.SIG_DFL)
            # The CLI dies with the broker; what it started lives on with its network closed.
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != self.parent:
                os._exit(1)
            sf.no_new_privs()
            # No capability but, for a root CLI, root's access to files whatever their mode (its
            # HOME may be another user's 0700 directory, as the image's /home/sleeve is): the
            # fence (Landlock) still decides what it may change and read. Its exec would
            # otherwise get them all back; no_new_privs keeps the set as small as this.
            caps.keep_only(caps.FILE_ACCESS if os.geteuid() == 0 else ())
            landlock.restrict_connect(self.ports, self.version)
            self.fence.apply()
            listener = sf.install()
            socket.send_fds(sock, [b"ok"], [listener])
            os.close(listener)
        except OSError as exc:
            with_errno = exc.strerror or str(exc)
            sock.send(with_errno.encode()[:500])
            os._exit(MISSING)
        sock.close()
        try:
            os.execvpe(self.argv[0], self.argv, self.env)  # noqa: S606 - the guarded command
        except OSError as exc:
            print(f"egress_guard: {self.argv[0]}: {exc.strerror}", file=sys.stderr, flush=True)
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def _signalfd(signals: Sequence[int]) -> int:
    mask = bytearray(128)  # glibc's sigset_t
    for sig in signals:
        mask[(sig - 1) // 8] |= 1 << ((sig - 1) % 8)
    buf = ctypes.create_string_buffer(bytes(mask), len(mask))
    fd = int(_libc.signalfd(-1, buf, SFD_FLAGS))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def _serve(broker: Broker, pid: int, child: int) -> int:
    sigfd = _signalfd(FORWARDED)
    poller = select.poll()
    for fd in (broker.listener, sigfd, child):
        poller.register(fd, select.POLLIN)
    while True:
        for fd, events in poller.poll():
            if fd == child:
                return os.waitpid(pid, 0)[1]
            if fd == sigfd:
                _forward(sigfd, pid)
            elif events & select.POLLIN:
                notification = sf.receive(broker.listener)
                if notification is not None:
                    broker.handle(notification)
            else:
                poller.unregister(broker.listener)  # no guarded process is left


def _forward(sigfd: int, pid: int) -> None:
    """Signals sent to the broker alone go on to the CLI. A terminal's (si_code SI_KERNEL) are
    not: the CLI, in the same foreground group, has had its own."""
    while True:
        try:
            info = os.read(sigfd, 128)
        except BlockingIOError:
            return
        signo, _err, code = struct.unpack_from("=Iii", info)
        if code <= 0:  # SI_USER, SI_QUEUE, SI_TKILL: from a process
            try:
                os.kill(pid, signo)
            except ProcessLookupError:
                return


def _exit_like(status: int) -> None:
    """Exit as the CLI did: with its code, or by its signal (the waiter then records 128+N)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGQUIT, signal.SIGABRT, signal.SIGSEGV):  # no core of ours
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            signal.raise_signal(sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _probe(allowed: tuple[str, int]) -> int:
    """The self-test, run guarded: the allowed address is reached (refused by nothing but a
    missing listener), the same port elsewhere, UDP and IPv6 are not. 0 or 1 with a line."""
    import errno

    host, port = allowed
    other = "127.0.0.2" if host != "127.0.0.2" else "127.0.0.3"
    failures = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        err = s.connect_ex(allowed)
        if err not in (0, errno.ECONNREFUSED):
            failures.append(f"{host}:{port} not reachable ({os.strerror(err)})")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if s.connect_ex((other, port)) in (0, errno.ECONNREFUSED):
            failures.append(f"{other}:{port} reachable")
    for family, kind, name in (
        (socket.AF_INET, socket.SOCK_DGRAM, "a UDP socket"),
        (socket.AF_INET6, socket.SOCK_STREAM, "an IPv6 socket"),
    ):
        try:
            socket.socket(family, kind).close()
            failures.append(f"{name} was made")
        except OSError:
            pass
    if failures:
        print("egress_guard: self-test failed: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


def self_test(
    allowed: Sequence[tuple[str, int]],
    *,
    timeout: float = 10.0,
    env: dict[str, str] | None = None,
    user: User | None = None,
) -> str | None:
    """Run the self-test from a guarded child the way the CLI will run (as `user`, with `env`,
    behind the resolver's fence); None when the guard holds, else one line naming what is
    missing or what got through."""
    argv = guard_argv(["--check"], allowed, None, fence=Fence(no_write=RESOLVER_FILES))
    argv = tuple(a for a in argv if a != "--")  # --check runs its own probe instead of ARGV
    who = f"SIDECAR_USER {user.spec}" if user is not None else "the CLI's user"
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
            cwd="/",
            **spawn_credentials(user),
        )
    except subprocess.TimeoutExpired:
        return f"egress_guard: self-test did not finish in {timeout:g}s"
    except PermissionError:
        return (
            f"{who} cannot run the sidecar's Python {sys.executable}, which runs the egress "
            "guard beside the CLI: install the sidecar from a Python every user may run "
            "(e.g. a venv made with /usr/bin/python3)"
        )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    last = lines[-1] if lines else f"egress_guard: self-test exited {done.returncode}"
    if "ModuleNotFoundError" in last or "Permission denied" in last:
        return f"{who} cannot load the sidecar's egress guard ({argv[4]}): {last}"
    return last


if __name__ == "__main__":
    main()
