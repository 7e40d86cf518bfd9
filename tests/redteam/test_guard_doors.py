"""The red team's ways past the egress guard itself (issue 29, findings 1-5), tried with the
guard's own argv as the sidecar builds it: each test runs the attack unguarded first (it works,
so the refusal below is the guard's) and then inside the guard. "Same uid" is the restricted
pod's shape (the listener's owner and the agent are one user, root here); "other uid" the
SIDECAR_USER one (uid 65534 with the system's Python). Loopback and private sockets only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from sidecar.core.layout import Layout
from sidecar.egress.fence import RESOLVER_FILES, fence_of
from sidecar.egress.heads import Refusal, parse_head
from sidecar.egress.reports import ReportListener
from tests.harness import wait_for_async
from tests.redteam.guardtools import NOBODY, guarded, run_as
from tests.tools import SYSTEM_PYTHON

HERE = Path(__file__).resolve().parent
ATTACKS = HERE / "attacks.py"
UIDS = pytest.mark.parametrize("uid", [0, NOBODY], ids=["same-uid", "other-uid"])
# A root CLI keeps root's access to files whatever their mode (DAC_OVERRIDE, DAC_READ_SEARCH:
# bits 1 and 2), which the fence bounds; nothing else.
FILES = f"{6:016x}"
ROOT_CLI_CAPS = {"CapEff": FILES, "CapBnd": FILES, "CapAmb": "0" * 16, "NoNewPrivs": "1"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs attackers as other uids")


def attacks(uid: int, argv: Sequence[str], *paths: Path) -> dict[str, object]:
    done = run_as(uid, [*argv, str(ATTACKS), *map(str, paths)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_renamed_or_linked_tmux_socket_still_leads_to_no_server_outside(shared: Path) -> None:
    """Finding 1: `mv tmux.sock x.sock; tmux -S x.sock run-shell ...` ran a command in the
    sidecar's tmux server, outside the guard, because the broker refused only the configured
    path. Now the broker decides by the listener (outside any guard: refused) whatever the
    path: renamed, hard-linked, symlinked. The agent and the server are one uid, as with the
    CLI's user (its tmux server runs as it) and in the one-uid mode."""
    uid = 0
    sock, marker = shared / "tmux.sock", shared / "escaped"
    tmux = ["tmux", "-f", "/dev/null"]
    run_as(uid, [*tmux, "-S", str(sock), "new-session", "-d", "sleep 120"], env=_tmux_env())
    try:
        escape = (
            f"cd {shared} && mv tmux.sock x.sock && ln x.sock y.sock && ln -s y.sock z.sock; "
            f'for s in x y z; do tmux -S $s.sock run-shell "echo $s >> {marker}"; done; '
            "mv x.sock tmux.sock"
        )
        done = run_as(uid, guarded(["sh", "-c", escape], deny_unix=[sock]), env=_tmux_env())
        assert sock.is_socket() and (shared / "y.sock").is_socket(), done.stderr
        assert not marker.exists(), marker.read_text()
        # Unguarded, the same renamed socket is the way in: the refusal above is the guard's.
        free = run_as(uid, ["sh", "-c", escape.replace("&& ln", "; ln")], env=_tmux_env())
        assert marker.exists() and marker.read_text().split() == ["x", "y", "z"], free.stderr
    finally:
        subprocess.run([*tmux, "-S", str(sock), "kill-server"], check=False, capture_output=True)


def _tmux_env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": "/", "TERM": "xterm"}


LISTEN = (
    "import os, signal, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777)\n"
    "s.listen(16); print('ready', flush=True); signal.pause()\n"
)


@contextlib.contextmanager
def listener(path: Path, owner: int) -> Iterator[None]:
    """A unix stream listener of `owner`'s outside the guard, every uid allowed by its mode:
    where ttyd, another root tmux server or any daemon of the trusted side would listen."""
    kw: dict[str, object] = {"user": owner, "group": owner, "extra_groups": []} if owner else {}
    with subprocess.Popen(
        [SYSTEM_PYTHON, "-c", LISTEN, str(path)],
        stdout=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            yield
        finally:
            proc.kill()


@pytest.mark.parametrize(
    ("owner", "uid"),
    [(0, 0), (NOBODY, NOBODY), (0, NOBODY)],
    ids=["same-uid-root", "one-uid-unprivileged", "other-uid"],
)
def test_no_unix_listener_outside_the_guard_is_reachable_by_any_path(
    owner: int, uid: int, shared: Path
) -> None:
    """Findings 2 and 4: ttyd's socket (no credential on it) and every root-owned socket were
    reachable; a deny list of paths misses a hard link, a rename, a symlink. A listener that
    no guarded process made is refused, whatever names it, whoever owns it (the restricted
    pod's one unprivileged uid included)."""
    sock = shared / "ttyd.sock"
    with listener(sock, owner):
        os.link(sock, shared / "hard.sock")
        (shared / "soft.sock").symlink_to(shared / "hard.sock")
        paths = [sock, shared / "hard.sock", shared / "soft.sock"]
        free = attacks(uid, [sys.executable], *paths)
        assert [free[f"unix{i}"] for i in range(3)] == ["ok"] * 3
        os.rename(sock, shared / "moved.sock")
        paths[0] = shared / "moved.sock"
        got = attacks(uid, guarded([sys.executable], deny_unix=[sock]), *paths)
        assert [got[f"unix{i}"] for i in range(3)] == ["EACCES"] * 3


@UIDS
def test_sockets_the_broker_never_sees_and_ip_options_are_refused(uid: int) -> None:
    """Finding 5 (and 4's loose source route): `socket(AF_UNIX, SOCK_RAW)` became a datagram
    socket and `socketpair` was not filtered, so a datagram reached the report socket; a SYN
    carried a source route through a denied first hop."""
    free = attacks(uid, [sys.executable])
    kinds = ("unix_raw", "unix_dgram", "pair_dgram", "ip_options")
    # IP options need CAP_NET_RAW: only a root agent (the one-uid mode as root) has it.
    assert {k: free[k] for k in kinds} == {**dict.fromkeys(kinds, "ok"), **_needs_root(uid)}
    got = attacks(uid, guarded([sys.executable]))
    assert {k: got[k] for k in kinds} == {
        "unix_raw": "EACCES",
        "unix_dgram": "EACCES",
        "pair_dgram": "EACCES",
        "ip_options": "EPERM",
    }
    assert got["bind_to_device"] == "EPERM"
    assert got["pair_stream"] == "ok"  # a stream pair reaches nothing but itself


def _needs_root(uid: int) -> dict[str, str]:
    return {"ip_options": "EPERM"} if uid else {}


def test_a_root_cli_keeps_only_file_access_and_cannot_change_the_resolver(tmp_path: Path) -> None:
    """Finding 4: a root CLI kept every capability: it edited /etc/hosts (the proxy then went
    where the agent chose), wrote routes through netlink. Under the guard it keeps only root's
    access to files whatever their mode, and the resolver's files are out of its reach all the
    same, as the sidecar's fence says (Landlock holds whatever the capabilities)."""
    fence = fence_of(Layout(tmp_path / "state"), one_uid=True, root_cli=True, writable=[tmp_path])
    assert set(RESOLVER_FILES) <= set(fence.no_write)
    free = attacks(0, [sys.executable])
    assert free["/etc/hosts"] == "ok" and free["status"]["CapEff"] != "0" * 16  # type: ignore[index]
    got = attacks(0, guarded([sys.executable], fence=fence))
    assert got["status"] == ROOT_CLI_CAPS
    assert {k: v for k, v in got.items() if k.startswith("/etc/")} == dict.fromkeys(
        (k for k in free if k.startswith("/etc/")), "EACCES"
    )
    route = ["ip", "route", "add", "unreachable", "198.51.100.0/24"]  # TEST-NET-2
    done = run_as(0, guarded(route, fence=fence))
    assert done.returncode != 0 and "Operation not permitted" in done.stderr


def test_loader_variables_reach_the_guarded_cli_alone(
    preload: Callable[[Path], Path], tmp_path: Path
) -> None:
    """Finding 3: the waiter exported the CLI's variables and then started the broker, which
    loaded the agent's LD_PRELOAD library with no filter of its own. Now they go in the env
    file the guard reads and reach the CLI only, after its filter: every process that loads
    the library is under seccomp (mode 2), the broker none."""
    log = tmp_path / "loaded.log"
    lib = preload(log)
    env_file = tmp_path / "cli.env"
    env_file.write_text(f"LD_PRELOAD={lib}\nGCONV_PATH={tmp_path}\nMARKED=1\n")
    script = "import os; print(os.environ.get('LD_PRELOAD'), os.environ.get('MARKED'))"
    done = run_as(0, guarded([sys.executable, "-c", script], env_file=env_file))
    assert done.returncode == 0 and done.stdout.split() == [str(lib), "1"], done.stderr
    marks = [line.split() for line in log.read_text().splitlines()]
    assert marks and all(mode == "2" for _, mode in marks), marks


async def test_the_agent_can_neither_forge_nor_hide_a_report(tmp_path: Path) -> None:
    """Finding 5: a datagram from inside the guard published a forged `egress-denied` (a port
    out of range too). Now no datagram leaves the guard, and the listener takes reports from
    the broker alone (the kernel's credentials): the real refusal arrives, nothing else."""
    denied: list[tuple[str, int, str]] = []
    path = tmp_path / "report.sock"
    broker: list[int] = []
    transport = ReportListener.open(
        path, lambda *d: denied.append(d), sender=lambda pid, uid: pid in broker, hows=("direct",)
    )
    forge = (
        "import socket, sys\n"
        'forged = b\'{"host": "forged", "port": 99999, "how": "direct"}\'\n'
        "for kind in (socket.SOCK_DGRAM, socket.SOCK_RAW):\n"
        "    try: socket.socket(socket.AF_UNIX, kind).sendto(forged, sys.argv[1])\n"
        "    except OSError: pass\n"
        "try: socket.create_connection(('127.0.0.2', 9))\n"
        "except OSError: pass\n"
    )
    try:
        proc = await asyncio.create_subprocess_exec(
            *guarded([sys.executable, "-c", forge, str(path)], report=path)
        )
        broker.append(proc.pid)
        assert await proc.wait() == 0
        await wait_for_async(lambda: denied, what="the broker's report")
        assert denied == [("127.0.0.2", 9, "direct")]
        assert transport.dropped == 0  # nothing else even arrived
    finally:
        transport.close()


@pytest.mark.parametrize("inside", ["\n", "\r", "\0", "\x1b"], ids=["LF", "CR", "NUL", "ESC"])
def test_a_control_character_inside_a_head_line_is_refused(inside: str) -> None:
    """Finding 5: a bare LF put a second `Host` past the proxy's check to the allowed upstream
    (which splits lines on LF alone). Any control character inside a line is now a 400."""
    allowed = "GET http://a.example/ HTTP/1.1\r\nHost: a.example"  # a head, blank line off
    assert parse_head(allowed.encode()).host == "a.example"
    with pytest.raises(Refusal) as refused:
        parse_head(f"{allowed}{inside}Host: evil.example".encode())
    assert str(refused.value) == "a control character inside a line of the request head"
    assert refused.value.status == 400
