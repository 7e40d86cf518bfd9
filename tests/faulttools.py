"""The fault tests' view of a sleeve: its processes in one scan of /proc (`census`), whether it
is whole again (one tmux server, one CLI, one ttyd, one supervisor, healthy), the CLIs they run
(`fault_clis`), the SIGKILL of a tmux server the moment it appears, a failure that comes with
the sidecar log's warnings, and a small real disk that fills up (`small_disk`, `fill`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness import CLIS, Proc, Sidecar, live_processes, py_cli, wait_for, write_cli_config
from tests.tools import missing

# Seconds from a fault until the sleeve is whole again. It covers the backoff of a CLI or ttyd
# killed soon after each start (1, 2, 4 s: test_faults kills each at most three times).
RECOVER_WITHIN = 20.0
# The scripts of the fault CLIs (`fault_clis`): the processes running one are the CLI's.
FAULT_SCRIPTS = (str(CLIS / "pidfile.py"), str(CLIS / "stubborn.py"))


def fault_clis(tmp: Path) -> Path:
    """The registry the fault tests run (written to `tmp`/clis.yaml): `alpha` and `beta` write
    their pid to `tmp`/NAME.pid; `stubborn` ignores SIGHUP and SIGTERM, as does the child it
    forks, and logs each start (fresh or resumed) to `tmp`/stubborn.pids."""
    stubborn = py_cli("stubborn.py", str(tmp / "stubborn.pids"), "fresh")["command"]
    return write_cli_config(
        tmp / "clis.yaml",
        {
            "alpha": py_cli("pidfile.py", str(tmp / "alpha.pid")),
            "beta": py_cli("pidfile.py", str(tmp / "beta.pid")),
            "stubborn": {"command": stubborn, "resume": [*stubborn[:-1], "resumed"]},
        },
    )


@dataclass(frozen=True)
class Census:
    """The sleeve's processes at one moment (from one scan of /proc)."""

    servers: list[Proc]  # tmux servers on our socket
    tmux: list[Proc]  # every tmux process on our socket: servers and clients
    cli_procs: list[Proc]  # every process running one of our CLIs' scripts
    ttyds: list[Proc]
    supervisors: list[Proc]  # init's children that run init's own command line
    procs: dict[int, Proc]

    @property
    def clis(self) -> list[Proc]:
        """The CLIs themselves: a CLI's own forks (stubborn's child) are not counted again."""
        ours = {p.pid for p in self.cli_procs}
        return [p for p in self.cli_procs if p.ppid not in ours]

    def under(self, root: int, proc: Proc) -> bool:
        """`proc` is `root` or one of its descendants."""
        seen = set()
        while proc.pid != root and proc.ppid in self.procs and proc.pid not in seen:
            seen.add(proc.pid)
            proc = self.procs[proc.ppid]
        return proc.pid == root


def census(sc: Sidecar, init: int | None = None) -> Census:
    """The processes of `sc` now; its supervisors only when its init's pid is given."""
    sock = str(sc.state_dir / "tmux.sock")
    marker = str(sc.tmp)
    procs = {p.pid: p for p in live_processes()}
    on_sock = [p for p in procs.values() if any(sock in a for a in p.argv)]
    init_argv = procs[init].argv if init is not None and init in procs else None
    return Census(
        servers=[p for p in on_sock if p.name == "tmux: server"],
        tmux=[p for p in on_sock if p.name.startswith("tmux")],
        cli_procs=[
            p
            for p in procs.values()
            if p.argv[:1] == (sys.executable,)
            and p.argv[1:2]
            and p.argv[1] in FAULT_SCRIPTS
            and any(marker in a for a in p.argv[2:])
        ],
        ttyds=[p for p in on_sock if p.name == "ttyd"],
        supervisors=[
            p for p in procs.values() if p.ppid == init and init_argv and p.argv == init_argv
        ],
        procs=procs,
    )


def not_whole(sc: Sidecar, killed: frozenset[int] = frozenset()) -> str | None:
    """Why the sleeve is not whole now (None: it is): healthy, its CLI and ttyd running, no
    resleeve under way, one tmux server on its socket, one CLI (the one /status names, with
    nothing of an older CLI left), one ttyd, one supervisor, and none of them a process in
    `killed` (a view from before the supervisor noticed a kill is not a recovery)."""
    assert sc.proc is not None
    code, health = sc.get("/health")
    if code != 200 or health.get("status") != "healthy":
        return f"/health {code} {health}"
    code, s = sc.get("/status")
    if code != 200:
        return f"/status {code} {s}"
    if not s["cli_running"] or s["ttyd_state"] != "running" or s["resleeving"]:
        keys = ("cli", "cli_state", "cli_pid", "ttyd_state", "resleeving", "warnings")
        shown = {k: s[k] for k in keys}
        return f"/status {shown}"
    c = census(sc, sc.proc.pid)
    clis = c.clis
    problems = []
    if len(c.servers) != 1:
        problems.append(f"tmux servers {[p.pid for p in c.servers]}")
    if [p.pid for p in clis] != [s["cli_pid"]]:
        problems.append(f"CLIs {[p.pid for p in clis]}, /status says {s['cli_pid']}")
    elif any(not c.under(clis[0].pid, p) for p in c.cli_procs):
        problems.append(f"processes of an older CLI left: {c.cli_procs}")
    if len(c.ttyds) != 1:
        problems.append(f"ttyds {[p.pid for p in c.ttyds]}")
    if len(c.supervisors) != 1:
        problems.append(f"supervisors {[p.pid for p in c.supervisors]}")
    now = {p.pid for p in [*c.servers, *clis, *c.ttyds, *c.supervisors]} | {s["cli_pid"]}
    if now & killed:
        problems.append(f"killed processes still counted: {sorted(now & killed)}")
    return "; ".join(problems) or None


def wait_whole(
    sc: Sidecar, timeout: float, what: str, killed: frozenset[int] = frozenset()
) -> float:
    """Wait until the sleeve is whole; the seconds it took. Fails with the last reason."""
    began = time.monotonic()
    last: list[str] = []

    def whole() -> bool:
        why = not_whole(sc, killed)
        if why is not None:
            last[:] = [why]
        return why is None

    try:
        wait_for(whole, timeout=timeout, interval=0.05, what=what)
    except AssertionError:
        raise AssertionError(f"{what}: not whole after {timeout:g}s: {last}") from None
    return time.monotonic() - began


def only_server(sc: Sidecar) -> int:
    """The pid of the one tmux server on the sleeve's socket (fails if there is not exactly
    one)."""
    [server] = census(sc).servers
    return server.pid


def kill_new_server(sc: Sidecar, old: set[int], within: float = 3.0) -> tuple[int, float] | None:
    """SIGKILL the first tmux server on our socket that is not one of `old`, the moment it
    appears (a scan of /proc takes about a millisecond); its pid and the seconds from seeing
    it to the SIGKILL sent (None: none appeared within `within` seconds)."""
    sock = str(sc.state_dir / "tmux.sock")
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for p in live_processes():
            if p.name == "tmux: server" and p.pid not in old and any(sock in a for a in p.argv):
                seen = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                return p.pid, time.monotonic() - seen
    return None


@contextlib.contextmanager
def explained(sc: Sidecar) -> Iterator[None]:
    """A failed assertion comes with the sidecar log's warnings and errors."""
    try:
        yield
    except AssertionError as exc:
        msg = f"{exc}\nsidecar log ({sc.log_path}), warnings and errors:\n{log_excerpt(sc)}"
        raise AssertionError(msg) from exc


def log_excerpt(sc: Sidecar, lines: int = 40) -> str:
    """The sidecar log's warnings and errors, last `lines` of them."""
    picked = []
    for line in sc.log().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            picked.append(line)
            continue
        if str(record.get("level")).lower() in ("warning", "error", "critical"):
            picked.append(f"{record.get('logger')}: {record.get('msg')}")
    return "\n".join(picked[-lines:])


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of `size` at `path` (root only: the disk-full fault, at the OS seam)."""
    path.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        missing(f"a small tmpfs cannot be mounted here ({done.stderr.strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> Path:
    """Fill the disk with one file, leaving nothing free."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"x" * 512):
                pass
    finally:
        os.close(fd)
    return filler
