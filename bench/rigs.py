"""The ways the screen figures run a CLI: under a sidecar (this tree's, or the baseline's from
git), Claude Code alone in tmux, and Claude Code under ccmanager. Each rig gives its pane (text,
keys), the agent states it reports with the time each was published, and the CLI's CPU time.

Times are `time.time()` throughout: ccmanager's states are stamped by its own hook processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.procs import (
    BenchError,
    cpu_seconds,
    make_sidecar,
    start_sidecar,
    stop_sidecar,
    wait_until,
)
from sidecar.process import pane_procs
from tests.agenttools import claude_env
from tests.e2e.anthropic_stub import AnthropicStub
from tests.harness import CLIS, REPO, Sidecar, write_cli_config

# The commit before the screen work: today's code, the baseline the figures stand beside.
BASELINE_COMMIT = "6a5f0240df904d43b2610b7b528469f730ba3622"
CCMANAGER_ENV = "BENCH_CCMANAGER"  # the ccmanager binary; else `ccmanager` on PATH
MENU = "Select a worktree"  # ccmanager's menu
CCM_STATES = {"busy": "working", "waiting_input": "waiting", "idle": "idle"}
PROMPT = re.compile(r"(run|stop) round \d+$")  # what the figures type
SIZE = ("-x", "200", "-y", "50")  # the sidecar's own window size, for every rig
TICK = os.sysconf("SC_CLK_TCK")


class Stub(AnthropicStub):
    """The API stub, answering every prompt of the figures (`PROMPT` and a round number) with
    its Bash call: after an Escape, Claude Code sends the dismissed call's result and the next
    prompt in one message, which the stub alone would answer with text."""

    def _wants_bash(self, body: dict[str, Any]) -> bool:
        messages = body.get("messages") or [{}]
        content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
        prompts = (
            [b for b in content if isinstance(b, dict) and PROMPT.match(str(b.get("text", "")))]
            if isinstance(content, list)
            else []
        )
        return super()._wants_bash(body) or bool(prompts and self.bash_command)


def baseline_tree(dest: Path, commit: str = BASELINE_COMMIT) -> Path:
    """`sidecar/` as it was at `commit`, extracted from this checkout's git history."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "sidecar"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        msg = f"git archive {commit[:7]}: {archive.stderr.decode(errors='replace')}"
        raise BenchError(msg)
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def ccmanager() -> str | None:
    return os.environ.get(CCMANAGER_ENV) or shutil.which("ccmanager")


def ccmanager_version(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "?"


class Timeline:
    """Agent states with the time each was published; `load` re-reads a file-backed source."""

    def __init__(self, load: Callable[[], list[tuple[float, str]]] | None = None) -> None:
        self._items: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._load = load

    def add(self, when: float, state: str) -> None:
        with self._lock:
            self._items.append((when, state))

    def items(self) -> list[tuple[float, str]]:
        if self._load is not None:
            return self._load()
        with self._lock:
            return list(self._items)

    def at(self, when: float) -> str | None:
        """The state published last at or before `when`."""
        before = [state for t, state in self.items() if t <= when]
        return before[-1] if before else None

    def first(self, state: Callable[[str], bool], after: float, until: float) -> float | None:
        """When a state matching `state` was first published after `after`, waiting until
        `until` for it; None if none came by then."""
        while True:
            for t, s in self.items():
                if t > after and state(s):
                    return t
            if time.time() > until:
                return None
            time.sleep(0.002)  # sleep-ok: polling interval of a deadline wait


class Pane:
    """One tmux pane, driven and read as a person would: keys, and what the screen shows."""

    def __init__(self, socket: Path, target: str = "main:0.0") -> None:
        self.socket = socket
        self.target = target

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, check=False
        )
        return done.stdout

    def text(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", self.target)

    def keys(self, *names: str, literal: bool = False) -> float:
        """Send keys; the time tmux has written them to the pane."""
        self._tmux("send-keys", "-t", self.target, *(["-l"] if literal else []), *names)
        return time.time()

    def wait(self, shows: Callable[[str], bool], timeout: float, what: str) -> float:
        """Poll the screen every ~10 ms; the time of the first capture that `shows`."""
        deadline = time.time() + timeout
        while True:
            taken = time.time()
            if shows(self.text()):
                return taken
            if taken > deadline:
                msg = f"timed out after {timeout:g}s waiting for {what}; screen:\n{self.text()}"
                raise BenchError(msg)
            time.sleep(0.01)  # sleep-ok: the screen's polling interval

    def pid(self) -> int:
        return int(self._tmux("display-message", "-p", "-t", self.target, "#{pane_pid}"))


def pane_cli_pid(sc: Sidecar) -> int:
    """The CLI's pid as today's sidecar finds it (`sidecar.process.pane_procs`), under the
    pane's waiter, not as `sc`'s /status says: a sidecar of an older tree may name a fork of the
    waiter that has already exited (fixed in 76520bc), a pid that is gone at once."""
    waiter = Pane(sc.state_dir / "tmux.sock").pid()
    pid = asyncio.run(pane_procs.cli_pid(waiter))
    if pid is None:
        msg = "the sidecar's CLI is not running"
        raise BenchError(msg)
    return pid


def claude_pid(root: int) -> int:
    """Claude Code's own process under `root` (a sidecar runs it under a small shell, ccmanager
    once a session starts), waiting for it to start."""

    def find() -> int | None:
        with contextlib.suppress(psutil.Error):
            for proc in [psutil.Process(root), *psutil.Process(root).children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    if proc.name() == "claude":
                        return proc.pid
        return None

    return int(wait_until(find, 15, f"a claude process under {root}", interval=0.01))


def tree_cpu(pid: int) -> float:
    """CPU seconds of `pid`'s tree: its live threads (schedstat) and the children it reaped."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = sum(cpu_seconds(procs).values())
    for proc in procs:
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
            total += (int(fields[13]) + int(fields[14])) / TICK  # cutime, cstime
    return total


class SidecarRig:
    """A sidecar of this tree (`tree` None) or of another tree, its /events read by a thread."""

    def __init__(self, sc: Sidecar, stub: AnthropicStub | None = None) -> None:
        self.sc = sc
        self.stub = stub
        self.states = Timeline()
        self.pane = Pane(sc.state_dir / "tmux.sock")
        self._stream: http.client.HTTPConnection | None = None

    def start(self) -> SidecarRig:
        start_sidecar(self.sc)
        self._stream = http.client.HTTPConnection("127.0.0.1", self.sc.port, timeout=3600)
        self._stream.request("GET", "/events")
        events = self._stream.getresponse()
        json.loads(events.readline())  # the heartbeat: subscribed
        threading.Thread(target=self._read, args=(events,), daemon=True).start()
        return self

    def _read(self, events: http.client.HTTPResponse) -> None:
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
            while line := events.readline():
                event = json.loads(line)
                if event.get("type") == "agent-state":
                    self.states.add(time.time(), event["state"])

    def resleeve(self) -> float:
        conn = http.client.HTTPConnection("127.0.0.1", self.sc.port, timeout=10)
        try:
            conn.request("POST", "/resleeve", body=b"{}")
            if conn.getresponse().status != 202:
                msg = "POST /resleeve was refused"
                raise BenchError(msg)
        finally:
            conn.close()
        return time.time()

    def cli_pid(self) -> int:
        assert self.sc.proc is not None
        return claude_pid(self.sc.proc.pid)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        stop_sidecar(self.sc)
        if self.stub is not None:
            self.stub.stop()


def claude_sidecar(
    tmp: Path, bash_command: str, tree: Path | None, *, trusted: bool = True
) -> SidecarRig:
    """Real Claude Code under a sidecar, offline against the stub, in manual permission mode."""
    stub = Stub(bash_command=bash_command).start()
    env = {} if tree is None else {"PYTHONPATH": str(tree)}
    sc = make_sidecar(tmp, cli="claude-code", **env)
    sc.env_extra.update(claude_env(sc, stub))
    if not trusted:
        untrust(sc.tmp / "home")
    return SidecarRig(sc, stub).start()


def untrust(home: Path) -> None:
    """A user's home: onboarding done, but the workspace never trusted (its trust dialog)."""
    state = home / ".claude.json"
    config = json.loads(state.read_text())
    config["projects"] = {}
    state.write_text(json.dumps(config))


def dialog_sidecar(tmp: Path, tree: Path | None) -> SidecarRig:
    """tests/clis/dialog_cli.py under a sidecar with the `activity` source."""
    command = [sys.executable, str(CLIS / "dialog_cli.py"), str(tmp / "typed")]
    tmp.mkdir(parents=True, exist_ok=True)
    config = write_cli_config(tmp / "clis.yaml", {"dlg": {"command": command}})
    env = {"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_ACTIVITY_QUIET": "0.5"}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return SidecarRig(make_sidecar(tmp, cli="dlg", **env)).start()


class TmuxRig:
    """Claude Code in a tmux server of its own: alone (`wrapper` None) or under ccmanager, with
    the same home, workspace and stub as a sidecar's; ccmanager's states from its status hooks."""

    def __init__(
        self, tmp: Path, bash_command: str, wrapper: str | None = None, *, trusted: bool = True
    ) -> None:
        self.stub = Stub(bash_command=bash_command).start()
        self.layout = Sidecar(tmp, cli="claude-code")  # not started: its home and workspace
        self.layout.workspace.mkdir(parents=True, exist_ok=True)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "TMUX"))},
            "HOME": str(tmp / "home"),
            **claude_env(self.layout, self.stub),
        }
        if not trusted:
            untrust(tmp / "home")
        self.wrapper = wrapper
        self.hooks = tmp / "ccm-states"
        self.states = Timeline(self._ccm_states)
        self.pane = Pane(tmp / "tmux.sock")
        if wrapper is not None:
            self._ccmanager_home()

    def _ccmanager_home(self) -> None:
        # ccmanager works in a git repository and reports each change of state to a hook.
        ws = str(self.layout.workspace)
        for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "x"]):
            subprocess.run(
                ["git", "-c", "user.name=b", "-c", "user.email=b@b", "-C", ws, *args], check=True
            )
        config = Path(self.env["HOME"]) / ".config" / "ccmanager"
        config.mkdir(parents=True)
        hooks = {
            name: {"command": f"echo {name} $(date +%s.%N) >> {self.hooks}", "enabled": True}
            for name in CCM_STATES
        }
        (config / "config.json").write_text(json.dumps({"statusHooks": hooks}))

    def _ccm_states(self) -> list[tuple[float, str]]:
        try:
            lines = self.hooks.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            name, _, when = line.partition(" ")
            if name in CCM_STATES and when:
                out.append((float(when), CCM_STATES[name]))
        return out

    def start(self) -> TmuxRig:
        argv = [self.wrapper] if self.wrapper else ["claude"]
        conf = self.pane.socket.with_name("tmux.conf")
        conf.write_text("set -g default-terminal tmux-256color\n")  # as the sidecar's
        tmux = ["tmux", "-S", str(self.pane.socket), "-f", str(conf)]
        where = ["-s", "main", *SIZE, "-c", str(self.layout.workspace)]
        subprocess.run([*tmux, "new-session", "-d", *where, *argv], env=self.env, check=True)
        if self.wrapper:  # its menu: Enter starts a session in the workspace's worktree
            self.pane.wait(lambda s: MENU in s, 15, "ccmanager's menu")
            # The menu is drawn a little before it reads keys: Enter again until it goes.
            for _ in range(20):
                self.pane.keys("Enter")
                with contextlib.suppress(BenchError):
                    self.pane.wait(lambda s: MENU not in s, 0.5, "a session")
                    return self
            msg = "ccmanager's menu did not take Enter"
            raise BenchError(msg)
        return self

    def restart(self) -> float:
        """Everything started again, as new; when it began."""
        self.stop()
        # ccmanager 4.4 remembers its sessions and would first offer to restore them.
        (Path(self.env["HOME"]) / ".config" / "ccmanager" / "sessions.json").unlink(missing_ok=True)
        began = time.time()
        self.start()
        return began

    def stop(self) -> None:
        subprocess.run(
            ["tmux", "-S", str(self.pane.socket), "kill-server"], capture_output=True, check=False
        )
        # A new server on this path must not reach the one still exiting.
        self.pane.socket.unlink(missing_ok=True)

    def cli_pid(self) -> int:
        return claude_pid(self.pane.pid())

    def close(self) -> None:
        self.stop()
        self.stub.stop()
