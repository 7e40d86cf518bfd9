"""Test harness: a real sidecar process on free loopback ports, and the suite's one way to wait
(`wait_for`, with its async twin) and one way to make an HTTP request (`http`).

Nothing here sleeps to synchronise: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPMessage
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml

from sidecar.core.loopback import free_ports

REPO = Path(__file__).resolve().parent.parent
CLIS = Path(__file__).resolve().parent / "clis"
NEEDLECAST_WRITER = Path(__file__).resolve().parent / "needlecast_writer.py"  # a writer process
# A child Python's path: this checkout first, then whatever the test run was given.
PYTHONPATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
T = TypeVar("T")


# What a predicate may raise while its answer is "not yet": a server still starting, a file
# half written, a process that just went.
_NOT_YET = (OSError, ValueError, psutil.Error)


class _Deadline:
    """The part both waits share: whether an answer ends the wait, and the failure once
    `timeout` seconds have passed. `what` may be a callable, called then, to show the latest
    state in the message."""

    def __init__(self, timeout: float, what: str | Callable[[], str]) -> None:
        self.timeout = timeout
        self.what = what
        self.end = time.monotonic() + timeout

    def reached(self, last: Any) -> bool:
        if last and not isinstance(last, Exception):
            return True
        if time.monotonic() > self.end:
            what = self.what() if callable(self.what) else self.what
            msg = f"timed out after {self.timeout}s waiting for {what}; last: {last!r}"
            raise AssertionError(msg)
        return False


def wait_for(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = _Deadline(timeout, what)
    while True:
        try:
            last: Any = predicate()
        except _NOT_YET as exc:
            last = exc
        if deadline.reached(last):
            return last
        time.sleep(interval)  # sleep-ok: the polling interval of a deadline wait


async def wait_for_async(
    predicate: Callable[[], Awaitable[T | None] | T | None],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str | Callable[[], str] = "condition",
) -> T:
    """`wait_for` inside a coroutine: `predicate` may be async, and each interval gives the event
    loop its turn (a WebSocket reader filling the buffer the predicate looks at)."""
    deadline = _Deadline(timeout, what)
    while True:
        try:
            last: Any = predicate()
            if inspect.isawaitable(last):
                last = await last
        except _NOT_YET as exc:
            last = exc
        if deadline.reached(last):
            return last
        await asyncio.sleep(interval)  # sleep-ok: the polling interval of a deadline wait


class Reply(tuple[int, Any]):
    """What `http` answers: the (status, body) pair tests unpack, with the headers beside it."""

    headers: HTTPMessage

    def __new__(cls, status: int, body: Any, headers: HTTPMessage) -> Reply:
        reply = super().__new__(cls, (status, body))
        reply.headers = headers
        return reply

    @property
    def status(self) -> int:
        return int(self[0])

    @property
    def body(self) -> Any:
        return self[1]


def bearer(token: str) -> dict[str, str]:
    """The Authorization header that sends `token`."""
    return {"Authorization": f"Bearer {token}"}


def http(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 10.0,
    token: str | None = None,
) -> Reply:
    """One request, as any client of the API makes it: `body` sent as JSON (or `raw` bytes),
    `token` as a bearer token. The body comes back parsed when it is JSON (bytes otherwise); an
    error status is an answer, not an exception."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    sent = {**(headers or {}), **(bearer(token) if token else {})}
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    if data is not None and "Content-Type" not in sent:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload, status, answered = resp.read(), resp.status, resp.headers
    except urllib.error.HTTPError as exc:
        payload, status, answered = exc.read(), exc.code, exc.headers
    try:
        return Reply(status, json.loads(payload), answered)
    except ValueError:
        return Reply(status, payload, answered)


def write_cli_config(path: Path, clis: dict[str, dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"clis": clis}), encoding="utf-8")
    return path


def py_cli(script: str, *args: str) -> dict[str, Any]:
    """A CLI definition that runs one of tests/clis/*.py with this interpreter."""
    return {"command": [sys.executable, str(CLIS / script), *args]}


def stubborn_starts(path: Path) -> list[dict[str, Any]]:
    """tests/clis/stubborn.py's JSON lines, one per start (a line still being written is left
    for the next look)."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.split("\n")[:-1]]


def stubborn_pids(path: Path) -> list[int] | None:
    """The latest stubborn CLI's [pid, child pid], None before it is ready."""
    starts = stubborn_starts(path)
    return [starts[-1]["pid"], starts[-1]["child"]] if starts else None


def message_client(workspace: Path) -> Any:
    """An aiohttp TestClient (start it with `async with`) of the message routes alone, with the
    API's body limit and error middleware, on `workspace`, served on a free loopback port."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from sidecar.api.app import make_answers
    from sidecar.api.messages import message_operations
    from sidecar.core.contract import MAX_BODY_BYTES

    app = web.Application(middlewares=[make_answers()], client_max_size=MAX_BODY_BYTES)
    for op in message_operations(app, workspace):
        app.router.add_route(op.method, op.path, op.handler)
    return TestClient(TestServer(app, host="127.0.0.1", port=0))


@dataclass
class Sidecar:
    """A sidecar started as a real process (optionally wrapped, e.g. in `unshare`)."""

    tmp: Path
    cli: str = "shell"
    env_extra: dict[str, str] = field(default_factory=dict)
    wrapper: list[str] = field(default_factory=list)
    port: int = 0  # 0: a free port (never ttyd_port)
    # None: ttyd on its unix socket (the default); a port: the loopback mode with a credential.
    ttyd_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        if not self.port:
            self.port = next(p for p in free_ports(2) if p != self.ttyd_port)

    @property
    def workspace(self) -> Path:
        return self.tmp / "workspace"

    @property
    def state_dir(self) -> Path:
        """tmp/state, or where `env_extra` puts it."""
        return Path(self.env_extra.get("SIDECAR_STATE_DIR", self.tmp / "state"))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.tmp / "sidecar.log"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "SLEEVE_"))}
        env.update(
            SLEEVE_NAME="test-sleeve",
            SLEEVE_CLI=self.cli,
            SIDECAR_HOST="127.0.0.1",
            SIDECAR_PORT=str(self.port),
            SIDECAR_WORKSPACE=str(self.workspace),
            SIDECAR_STATE_DIR=str(self.state_dir),
            SIDECAR_STOP_GRACE="2",
            SHELL="/bin/bash",
            # A private HOME: the login shell must not run this machine's profile (pyenv's
            # rehash lock stalls concurrent shells for up to a minute).
            HOME=str(self.tmp / "home"),
            PYTHONPATH=PYTHONPATH,
        )
        if self.ttyd_port is not None:
            env["TTYD_PORT"] = str(self.ttyd_port)
        env.update(self.env_extra)
        return env

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the sidecar's process, waiting for nothing."""
        argv = [*self.wrapper, sys.executable, "-m", "sidecar", "run"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, env=self.env(), stdout=log, stderr=subprocess.STDOUT, cwd=self.tmp
            )
        return self.proc

    def start(self, wait_healthy: bool = True) -> Sidecar:
        self.spawn()
        wait_for(self._answers, timeout=15, what=f"/health on {self.url} (log: {self.log_path})")
        if wait_healthy:
            self.wait_status(
                lambda s: s["cli_running"] and s["ttyd_state"] == "running", self._not_running
            )
        return self

    def _not_running(self) -> str:
        """A start that timed out: what /status said of the CLI and ttyd, and the log's end."""
        try:
            s = self.status()
            said: Any = {k: s[k] for k in ("cli_state", "cli_exit_code", "ttyd_state", "warnings")}
        except (OSError, AssertionError) as exc:
            said = exc
        tail = "\n".join(self.log().splitlines()[-40:])
        return f"CLI and ttyd running; /status said {said}; the log ends:\n{tail}"

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            msg = f"sidecar exited with {self.proc.returncode}:\n{self.log()}"
            raise AssertionError(msg)
        try:
            return self.get("/health")[0] == 200
        except OSError:
            return False

    def auth_headers(self, headers: dict[str, str] | None = None) -> dict[str, str]:
        """The admin token when one is configured, unless the test passes its own headers."""
        if headers is not None:
            return headers
        token = self.env_extra.get("SIDECAR_TOKEN")
        return bearer(token) if token else {}

    def get(self, path: str, headers: dict[str, str] | None = None, **kw: Any) -> Reply:
        return http("GET", self.url + path, headers=self.auth_headers(headers), **kw)

    def post(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None, **kw: Any
    ) -> Reply:
        return http("POST", self.url + path, body, headers=self.auth_headers(headers), **kw)

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        return dict(body)

    def wait_status(
        self,
        predicate: Callable[[dict[str, Any]], Any],
        what: str | Callable[[], str],
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            s = self.status()
            return s if predicate(s) else None

        return wait_for(check, timeout=timeout, what=what)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 15.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill_everything(self) -> None:
        """Teardown: whatever a failed test left behind."""
        self.kill_processes()
        self.kill_servers()

    def kill_processes(self) -> None:
        """SIGKILL the sidecar and every process under it."""
        if self.proc is None:
            return
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process(self.proc.pid).children(recursive=True)
            for p in [*tree, psutil.Process(self.proc.pid)]:
                with contextlib.suppress(psutil.Error):
                    p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)

    def kill_servers(self) -> None:
        """Stop the tmux server on the state dir's sockets (a daemon: not under the sidecar)."""
        if self.proc is None:
            return
        for sock in (self.state_dir / "tmux.sock", self.state_dir / "session" / "tmux.sock"):
            if sock.exists():
                subprocess.run(
                    ["tmux", "-S", str(sock), "kill-server"], capture_output=True, check=False
                )


@contextlib.contextmanager
def running_sidecar(tmp: Path, **kw: Any) -> Iterator[Sidecar]:
    sc = Sidecar(tmp, **kw)
    try:
        yield sc
    finally:
        sc.kill_everything()


@dataclass(frozen=True)
class Proc:
    """One live process as /proc shows it."""

    pid: int
    ppid: int
    name: str  # the kernel's comm: "tmux: server", "ttyd", "python3", ...
    argv: tuple[str, ...]


def live_processes() -> list[Proc]:
    """Every process there is now, zombies left out, read straight from /proc: a scan costs
    about a millisecond (a quarter of psutil's), so a tight loop catches a process within a few."""
    procs = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read()
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                cmdline = fh.read()
        except OSError:
            continue  # gone meanwhile
        # The name (in parentheses) may hold spaces and ')': the fields follow the last one.
        end = stat.rindex(b")")
        state, ppid = stat[end + 2 :].split()[:2]
        if state == b"Z":
            continue
        name = stat[stat.index(b"(") + 1 : end].decode(errors="replace")
        argv = tuple(a.decode(errors="replace") for a in cmdline.split(b"\0")[:-1])
        procs.append(Proc(int(entry.name), int(ppid), name, argv))
    return procs
