"""Least privilege with real processes: the sidecar started as root with SIDECAR_USER runs tmux,
ttyd and the CLI as an unprivileged uid, keeps only SETUID, SETGID and KILL itself, and leaves
that uid nothing to read: no token, no terminal credential, in /proc or in any file it can
open. Files it makes, and the sidecar's .needlecast/.cstack writes, belong to it.

The uid is a bare one with no passwd entry (as a host user's uid is inside an image). Temp
dirs are 0700: each one the user must pass through gets o+x here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from sidecar.core.loopback import free_port
from sidecar.process.ttyd import BASE_PATH, VIEWER_FLAGS, WRITER_FLAGS
from sidecar.security.caps import CAP_KILL, CAP_SETGID, CAP_SETUID, current_caps
from tests.harness import CLIS, REPO, Sidecar, bearer, wait_for, write_cli_config
from tests.tools import SYSTEM_PYTHON, missing

UID = GID = 23456  # no passwd entry on purpose


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        missing("running the CLI as another user needs the tests to run as root")


@pytest.fixture
def user_sidecar(
    root: None, make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> Iterator[Callable[..., Sidecar]]:
    """A sidecar with SIDECAR_USER=UID:GID and a workspace owned by that uid."""
    short_tmp.chmod(0o711)

    def make(env_extra: dict[str, str] | None = None, **kw: object) -> Sidecar:
        sc = make_sidecar(env_extra={"SIDECAR_USER": f"{UID}:{GID}", **(env_extra or {})}, **kw)
        sc.tmp.chmod(0o711)
        sc.workspace.mkdir()
        os.chown(sc.workspace, UID, GID)
        return sc

    yield make


def processes_of(sc: Sidecar) -> dict[str, list[psutil.Process]]:
    """The sidecar's processes by role: init, supervisor, and what runs as the CLI's user."""
    assert sc.proc is not None
    init = psutil.Process(sc.proc.pid)
    supervisor = [p for p in init.children() if p.uids().real == 0 and "python" in p.name()]
    user = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):  # gone meanwhile, or a zombie of another run
            if proc.uids().real == UID and proc.status() != psutil.STATUS_ZOMBIE:
                user.append(proc)
    return {"init": [init], "supervisor": supervisor, "user": user}


def caps(pid: int, kind: str) -> frozenset[int]:
    return current_caps(kind, pid)


async def open_terminal(
    sc: Sidecar, session: aiohttp.ClientSession, token: str
) -> aiohttp.ClientWebSocketResponse:
    ws = await session.ws_connect(
        sc.url + "/terminal/ws", protocols=("tty",), headers=bearer(token)
    )
    await ws.send_str(json.dumps({"AuthToken": "", "columns": 80, "rows": 24}))
    msg = await ws.receive(timeout=10)  # the first output: tmux attach runs
    assert msg.type is aiohttp.WSMsgType.BINARY, msg
    return ws


def test_the_cli_user_finds_no_token_or_credential_and_owns_what_is_made(
    user_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    admin, view = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    private = short_tmp / "secrets"
    private.mkdir(mode=0o700)
    view_file = private / "view-token"
    view_file.write_text(view + "\n")
    view_file.chmod(0o600)  # as the start requires of a credential file with SIDECAR_USER
    sc = user_sidecar()
    report, go = sc.workspace / "snoop.json", sc.tmp / "go"
    roots = [str(sc.state_dir), str(sc.workspace), "/run"]
    snoop = [SYSTEM_PYTHON, str(CLIS / "snoop.py"), str(report), str(go)]
    snoop += [",".join(t.encode().hex() for t in (admin, view)), json.dumps(roots)]
    snoop += [json.dumps([str(view_file)])]
    config = write_cli_config(sc.tmp / "clis.yaml", {"snoop": {"command": snoop}})
    sc.cli = "snoop"
    sc.env_extra.update(
        SIDECAR_TOKEN=admin,  # in the environment: init must start again without it
        SIDECAR_VIEW_TOKEN_FILE=str(view_file),
        SIDECAR_CLI_CONFIG=str(config),
        SLEEVE_GOAL="Find the tokens",
    )
    sc.start()

    async def terminals() -> None:
        async with aiohttp.ClientSession() as session:
            # A writer's and a viewer's tmux clients run while the CLI looks.
            held = [await open_terminal(sc, session, t) for t in (admin, view)]
            go.touch()
            await asyncio.to_thread(wait_for, report.exists, 30, what="the snoop's report")
            for ws in held:
                await ws.close()

    asyncio.run(terminals())
    found = json.loads(report.read_text())
    assert (found["uid"], found["euid"]) == (UID, UID)
    assert found["groups"] == []  # no passwd entry: no supplementary groups, root's none
    assert found["home"] == str(sc.workspace)  # no passwd entry, no SIDECAR_USER_HOME
    assert found["found"] == [], found["found"]
    assert list(found["ttyds"].values()) == [False]  # it saw this sleeve's ttyd: no credential
    assert found["secret_files"] == {str(view_file): "PermissionError"}
    assert found["procs"] > 3 and found["files"] > 0
    # Root's view: the token is in no process's environment or argv either (init started
    # itself again without it: /proc shows the environment a process was started with).
    for proc in psutil.process_iter():
        for what in ("environ", "cmdline"):
            try:
                data = Path(f"/proc/{proc.pid}/{what}").read_bytes()
            except OSError:
                continue
            assert admin.encode() not in data, (proc.pid, what)
            assert view.encode() not in data, (proc.pid, what)
    # The tokens still work: they were handed over, not lost.
    assert sc.get("/status", headers=bearer(view))[0] == 200
    assert sc.get("/status", headers=bearer("wrong"))[0] == 401
    code, _ = sc.post(
        "/inbox", {"from": "test", "type": "task", "content": "hi"}, headers=bearer(admin)
    )
    assert code == 201
    made = [
        sc.workspace / "made-by-cli.txt",
        sc.workspace / "made-by-cli-dir",
        sc.workspace / ".needlecast",
        sc.workspace / ".needlecast" / "inbox.md",
        sc.workspace / ".cstack",
        sc.workspace / ".cstack" / "CURRENT.md",
    ]
    for path in made:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (UID, GID), path
    assert stat.S_IMODE((sc.workspace / ".needlecast").stat().st_mode) == 0o700  # its owner's
    assert sc.stop() == 0
    st = (sc.workspace / ".cstack" / "CURRENT.md").stat()
    assert (st.st_uid, st.st_gid) == (UID, GID)  # rewritten at shutdown (`killed`), same owner


def test_init_and_the_supervisor_keep_only_setuid_setgid_and_kill(
    user_sidecar: Callable[..., Sidecar],
) -> None:
    sc = user_sidecar().start()
    roles = processes_of(sc)
    assert len(roles["supervisor"]) == 1
    kept = {CAP_SETUID, CAP_SETGID, CAP_KILL}
    for proc in roles["init"] + roles["supervisor"]:
        assert caps(proc.pid, "CapEff") == kept
        assert caps(proc.pid, "CapPrm") == kept
        assert caps(proc.pid, "CapBnd") == kept
        assert caps(proc.pid, "CapAmb") == frozenset()
        assert proc.uids().real == 0 and proc.gids().real == 0
        assert f"Groups:\t{GID} \n" in Path(f"/proc/{proc.pid}/status").read_text()
    names = {p.name() for p in roles["user"]}
    assert {"ttyd", "bash"} <= names and any(n.startswith("tmux") for n in names), names
    for proc in roles["user"]:
        assert proc.uids() == (UID, UID, UID) and proc.gids() == (GID, GID, GID)
        assert caps(proc.pid, "CapEff") == frozenset() == caps(proc.pid, "CapPrm")
    # ttyd's socket is in a directory only root and the user's group can enter.
    session = sc.state_dir / "session"
    st = session.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, GID, 0o3770)
    assert stat.S_IMODE(sc.state_dir.stat().st_mode) == 0o710
    assert (session / "ttyd.sock").is_socket() and (session / "tmux.sock").is_socket()
    # The CLI can still be stopped and restarted (KILL and SETUID at work).
    before = sc.status()["cli_pid"]
    assert sc.post("/resleeve", {})[0] == 202
    sc.wait_status(lambda s: s["cli_running"] and s["cli_pid"] != before, "the CLI again")
    assert psutil.Process(sc.status()["cli_pid"]).uids().real == UID
    assert sc.stop() == 0


async def test_a_viewers_terminal_cannot_type_even_past_the_proxys_filter(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """The proxy drops a viewer's input frames; behind it the viewer's tmux client is attached
    read-only. This client talks to ttyd's socket directly, with the URL the proxy builds for
    a viewer, and types: the pane never sees it. (A writer's URL, the control, does type.)"""
    sc = make_sidecar().start()
    tmux = ["tmux", "-S", str(sc.state_dir / "tmux.sock")]
    marker = secrets.token_hex(6)

    def tmux_out(*args: str) -> str:
        return subprocess.run([*tmux, *args], capture_output=True, text=True, check=True).stdout

    connector = aiohttp.UnixConnector(path=str(sc.state_dir / "ttyd.sock"))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def attach(flags: str) -> aiohttp.ClientWebSocketResponse:
            ws = await session.ws_connect(
                f"http://localhost{BASE_PATH}/ws", params={"arg": flags}, protocols=("tty",)
            )
            await ws.send_str(json.dumps({"AuthToken": "", "columns": 80, "rows": 24}))
            await ws.receive(timeout=10)  # the first output: tmux attach has made its pty raw
            return ws

        viewer = await attach(VIEWER_FLAGS)
        await viewer.send_bytes(f"0echo viewer-{marker}\r".encode())
        await viewer.send_bytes(b"1" + json.dumps({"columns": 20, "rows": 5}).encode())
        # Ordered after it: a writer's client types the control line.
        writer = await attach(WRITER_FLAGS)
        await writer.send_bytes(f"0echo writer-{marker}\r".encode())
        await asyncio.to_thread(
            wait_for, lambda: f"writer-{marker}" in tmux_out("capture-pane", "-p"), what="writer"
        )
        # The ttyd clients (the sidecar's own activity client is a control-mode one).
        flags = [
            f
            for f in tmux_out("list-clients", "-F", "#{client_flags}").split()
            if "control-mode" not in f.split(",")
        ]
        assert sorted("read-only" in f.split(",") for f in flags) == [False, True], flags
        await viewer.close()
        await writer.close()
    assert f"viewer-{marker}" not in tmux_out("capture-pane", "-p", "-S", "-")
    size = tmux_out("display-message", "-p", "-t", "main", "#{window_width}x#{window_height}")
    assert size.strip() == "200x50"


async def test_a_viewer_through_the_proxy_gets_a_read_only_tmux_client(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    view, admin = "v-" + secrets.token_hex(8), "a-" + secrets.token_hex(8)
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": admin, "SIDECAR_VIEW_TOKEN": view}).start()
    tmux = ["tmux", "-S", str(sc.state_dir / "tmux.sock")]
    listing = [*tmux, "list-clients", "-F", "#{client_flags}"]
    async with aiohttp.ClientSession() as session:
        ws = await open_terminal(sc, session, view)

        def viewer_client() -> list[str] | None:
            # The sidecar's own activity client (control mode) is listed too; skip it.
            out = subprocess.run(listing, capture_output=True, text=True).stdout
            clients = [f.split(",") for f in out.split()]
            return next((f for f in clients if "control-mode" not in f), None)

        flags = await asyncio.to_thread(wait_for, viewer_client, what="the viewer's tmux client")
        await ws.close()
    assert "read-only" in flags and "ignore-size" in flags, flags


def test_registry_env_values_reach_the_cli_but_no_argv(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    value = "v-" + secrets.token_hex(8) + " $HOME `id` \\n\nline two"
    out = short_tmp / "env.json"
    script = (
        "import json, os, signal, sys; "
        "json.dump({'v': os.environ.get('REG_VALUE')}, open(sys.argv[1] + '.tmp', 'w')); "
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1]); signal.pause()"
    )
    config = write_cli_config(
        short_tmp / "clis.yaml",
        {
            "envcli": {
                "command": [sys.executable, "-c", script, str(out)],
                "env": {"REG_VALUE": value},
            }
        },
    )
    sc = make_sidecar(cli="envcli", env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start()
    got = wait_for(lambda: out.exists() and json.loads(out.read_text()), what="the CLI's env")
    assert got["v"] == value
    marker = value.split()[0].encode()
    for proc in psutil.process_iter():
        try:
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert marker not in argv, (proc.pid, argv[:200])
    env_file = sc.state_dir / "cli.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o640


def test_tokens_given_in_the_environment_are_gone_from_inits_proc_environ(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """Without SIDECAR_USER the CLI is the sidecar's own uid and may read /proc/<init>/environ:
    what the kernel shows there is the block the process was started with, so init starts
    itself again (same pid) without the token."""
    admin = "env-" + secrets.token_hex(12)
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": admin}).start()
    roles = processes_of(sc)
    assert sc.proc is not None and roles["init"][0].pid == sc.proc.pid  # re-exec kept the pid
    for proc in roles["init"] + roles["supervisor"]:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert admin.encode() not in environ
        assert b"SIDECAR_TOKEN=" not in environ
        assert admin.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert not [f for f in os.listdir(f"/proc/{proc.pid}/fd") if "memfd" in _link(proc, f)]
    assert sc.get("/status", headers=bearer(admin))[0] == 200
    assert sc.get("/status", headers={})[0] == 401


def _link(proc: psutil.Process, fd: str) -> str:
    try:
        return os.readlink(f"/proc/{proc.pid}/fd/{fd}")
    except OSError:
        return ""


def test_a_fifo_as_current_md_neither_blocks_status_nor_shutdown(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar()
    (sc.workspace / ".cstack").mkdir(parents=True)
    os.mkfifo(sc.workspace / ".cstack" / "CURRENT.md")
    sc.start()
    status = sc.status()
    assert status["status"] == "unknown"
    assert any("not a regular file" in w for w in status["warnings"]), status["warnings"]
    started = time.monotonic()
    assert sc.stop(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert stat.S_ISFIFO((sc.workspace / ".cstack" / "CURRENT.md").lstat().st_mode)


def test_current_md_leading_out_of_the_workspace_is_neither_read_nor_written(
    root: None, make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """A symlink to a root-only file outside the workspace (as /etc/shadow is): /status does not
    show it, shutdown's `killed` does not write it. A device node is not opened either."""
    outside = short_tmp / "shadow"
    outside.write_text("# Current State\n\n## Status\nworking\n\n## Task\nroot:$6$secret-hash\n")
    outside.chmod(0o600)
    before = (outside.read_bytes(), outside.stat().st_mtime_ns)
    sc = make_sidecar()
    (sc.workspace / ".cstack").mkdir(parents=True)
    (sc.workspace / ".cstack" / "CURRENT.md").symlink_to(outside)
    sc.start()
    status = sc.status()
    assert status["status"] == "unknown" and status["current_task"] is None
    assert "secret-hash" not in json.dumps(status)
    assert any("outside the workspace" in w for w in status["warnings"]), status["warnings"]
    assert sc.stop() == 0
    assert (outside.read_bytes(), outside.stat().st_mtime_ns) == before
    # A device in its place: /status says so without opening it.
    current = sc.workspace / ".cstack" / "CURRENT.md"
    current.unlink()
    os.mknod(current, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    sc2 = Sidecar(sc.tmp, env_extra={"SIDECAR_STATE_DIR": str(sc.tmp / "state2")})
    try:
        sc2.start()
        status = sc2.status()
        assert status["status"] == "unknown"
        assert any("not a regular file" in w for w in status["warnings"])
        assert sc2.stop() == 0
        assert stat.S_ISCHR(current.lstat().st_mode)
    finally:
        sc2.kill_everything()


def test_a_workspace_the_user_cannot_write_is_served_with_a_warning(
    user_sidecar: Callable[..., Sidecar],
) -> None:
    sc = user_sidecar()
    os.chown(sc.workspace, 0, 0)
    sc.workspace.chmod(0o755)
    sc.start()
    warnings = sc.status()["warnings"]
    assert any("read-only for SIDECAR_USER" in w for w in warnings), warnings
    assert sc.get("/health")[0] == 200


def test_as_root_without_sidecar_user_what_the_sidecar_makes_is_the_workspace_owners(
    root: None, make_sidecar: Callable[..., Sidecar]
) -> None:
    sc = make_sidecar(env_extra={"SLEEVE_GOAL": "own it"})
    sc.workspace.mkdir()
    os.chown(sc.workspace, UID, GID)
    sc.start()
    assert sc.post("/inbox", {"from": "t", "type": "task", "content": "x"})[0] == 201
    for path in (".needlecast", ".needlecast/inbox.md", ".cstack", ".cstack/CURRENT.md"):
        st = (sc.workspace / path).stat()
        assert (st.st_uid, st.st_gid) == (UID, GID), path
    assert sc.stop() == 0


def test_an_outbox_rewrite_keeps_the_files_owner_and_mode(root: None, short_tmp: Path) -> None:
    from sidecar.workspace.mailbox import Mailbox
    from sidecar.workspace.needlecast import Message

    box = Mailbox(short_tmp, "outbox")
    for i in range(3):
        box.append(Message(id=f"m{i}", sender="a", type="task", time=None, body=f"c{i}"))
    path = short_tmp / ".needlecast" / "outbox.md"
    os.chown(path, UID, GID)
    path.chmod(0o644)
    assert box.remove(["m1"]).removed == 1
    st = path.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (UID, GID, 0o644)


def test_sidecar_attach_as_root_joins_the_session_as_the_user(
    user_sidecar: Callable[..., Sidecar],
) -> None:
    """`docker exec ... sidecar attach` runs as root: its tmux client must be the session's
    user, or that user could make it run commands as root (`detach-client -E`)."""
    sc = user_sidecar().start()
    env = {**sc.env(), "TERM": "xterm"}
    attach = subprocess.Popen(
        ["script", "-qfc", f"{sys.executable} -m sidecar attach", "/dev/null"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        sock = sc.state_dir / "session" / "tmux.sock"
        listing = ["tmux", "-S", str(sock), "list-clients", "-F", "#{client_uid}"]

        def attached() -> str:
            out = subprocess.run(listing, capture_output=True, text=True, user=UID, group=GID)
            return out.stdout.strip()

        assert wait_for(attached, what="sidecar attach's client") == str(UID)
    finally:
        assert attach.stdin is not None
        attach.stdin.close()
        attach.send_signal(signal.SIGTERM)
        attach.wait(10)


def test_with_sidecar_user_the_loopback_terminal_mode_works_too(
    user_sidecar: Callable[..., Sidecar],
) -> None:
    """TTYD_PORT with SIDECAR_USER: ttyd (the user) on loopback with its credential (the weaker
    mode: that argv is readable in /proc), still reached through the proxy."""
    sc = user_sidecar(ttyd_port=free_port()).start()
    marker = secrets.token_hex(6)

    async def typed() -> None:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(sc.url + "/terminal/ws", protocols=("tty",))
            await ws.send_str(json.dumps({"AuthToken": "", "columns": 80, "rows": 24}))
            await ws.receive(timeout=10)
            await ws.send_bytes(f"0echo port-{marker}\r".encode())
            deadline = time.monotonic() + 10
            seen = b""
            while f"port-{marker}".encode() not in seen:
                msg = await ws.receive(timeout=max(deadline - time.monotonic(), 0.1))
                assert msg.type is aiohttp.WSMsgType.BINARY, msg
                seen += msg.data[1:]
            await ws.close()

    asyncio.run(typed())
    ttyd = next(p for p in processes_of(sc)["user"] if p.name() == "ttyd")
    assert "--credential" in ttyd.cmdline() and str(sc.ttyd_port) in ttyd.cmdline()
