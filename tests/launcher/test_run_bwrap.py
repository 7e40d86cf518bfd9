"""`sleeve run --runtime bwrap`: a real sidecar as PID 1 in bubblewrap, seen by `ps`, stopped."""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sidecar.core.loopback import free_port
from tests.harness import http, wait_for
from tests.proctools import ns_pid
from tests.webserver import web_server

from .helpers import RUN_ID, SECRET, Result

pytestmark = pytest.mark.needs("bwrap")


def health(url: str) -> dict[str, object]:
    status, body = http("GET", url + "health", timeout=5)
    assert status == 200
    return dict(body)


def refused(url: str) -> bool:
    try:
        health(url)
    except OSError:
        return True
    return False


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if item)


def test_bwrap_run_starts_a_sidecar_as_pid_1_that_ps_shows_and_stop_ends(
    home: Path, project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    port = free_port()
    args = ("run", "--project", str(project), "--runtime", "bwrap", "--shell", "--port", str(port))
    secrets = {"ANTHROPIC_API_KEY": SECRET, "UNLISTED_TOKEN": "must-not-pass"}
    dry = sleeve_proc(*args, "--dry-run", extra_env=secrets)
    assert dry.code == 0, dry.err
    res = sleeve_proc(*args, "--wait", "40", extra_env=secrets)
    waiter: psutil.Process | None = None
    try:
        assert res.code == 0, res.err
        url = f"http://127.0.0.1:{port}/"
        assert url in res.out
        assert health(url)["status"] in ("healthy", "degraded")

        (run,) = json.loads(sleeve_proc("ps", "--json").out)
        assert (run["runtime"], run["status"], run["slot"], run["port"]) == (
            "bwrap",
            "running",
            1,
            port,
        )
        waiter = psutil.Process(run["pid"])
        # The very argv --dry-run printed is what runs (only the run id and log name differ).
        ran = [RUN_ID.sub("ID", word) for word in waiter.cmdline()]
        assert ran == [RUN_ID.sub("ID", word) for word in shlex.split(dry.out)]
        (bwrap,) = waiter.children()
        (init,) = bwrap.children()
        assert bwrap.name() == "bwrap"
        assert ns_pid(init) == 1, "the sidecar is PID 1 in its namespace"
        assert init.cmdline()[-3:] == ["-m", "sidecar", "run"]
        # The sandbox runs the tmux the launcher's PATH has (the tests': scripts/build-tmux's).
        servers = wait_for(
            lambda: [p for p in init.children(recursive=True) if p.name() == "tmux: server"],
            what="the sleeve's tmux server",
        )
        assert servers[0].cmdline()[0] == shutil.which("tmux")

        # Only the allow-list reaches the sandbox; the key's value is in no argv.
        inside = environ(init.pid)
        audited = dry.err.split("env names:")[1].split()
        assert sorted(inside.keys() - {"PWD"}) == audited  # bwrap itself sets PWD for --chdir
        assert inside["ANTHROPIC_API_KEY"] == SECRET and inside["HOME"] == "/home/sleeve"
        assert inside["SIDECAR_PORT"] == str(port) and inside["SLEEVE_CLI"] == "shell"
        for proc in (waiter, bwrap, init):
            assert SECRET not in " ".join(proc.cmdline())
        # Every bind source existed before the mount (a missing one turns into a directory).
        slot_dir = Path(
            json.loads(sleeve_proc("slots", "--project", project, "--json").out)["slots"][0][
                "folder"
            ]
        )
        assert (slot_dir / ".claude.json").is_file()
        assert oct((slot_dir / ".claude.json").stat().st_mode & 0o777) == "0o600"
        log = Path(run["log"])
        assert log.parent == home / "logs" and oct(log.stat().st_mode & 0o777) == "0o600"

        slots = json.loads(sleeve_proc("slots", "--project", project, "--json").out)["slots"]
        assert slots[0]["running"] and slots[0]["runtime"] == "bwrap"

        # state.json lost: the running sleeve is found all the same by everything that could
        # otherwise start a second one on the same slot or delete its credentials.
        (home / "state.json").unlink()
        rm = sleeve_proc("rm", "1", "--project", project)
        assert rm.code == 1 and "slot 1 is running" in rm.err, rm.err
        assert slot_dir.is_dir()
        again = sleeve_proc(
            "run", "--project", project, "--runtime", "bwrap", "--shell", "--slot", "1"
        )
        assert again.code == 1 and "running" in again.err, again.err

        stop = sleeve_proc("stop", "1", "--project", project)
        assert stop.code == 0, stop.err
        wait_for(lambda: not waiter.is_running() or waiter.status() == psutil.STATUS_ZOMBIE)
        assert refused(url)
        (run,) = json.loads(sleeve_proc("ps", "--json").out)
        assert run["status"] == "stopped"
    finally:
        if waiter is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                waiter.send_signal(signal.SIGKILL)  # --die-with-parent takes the sandbox along


def test_a_sleeve_that_dies_at_start_up_is_reported_with_its_log_and_its_exit_code(
    project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    """The sidecar exits 2 on a bad configuration (CONTRACT.md); the waiter records the code.
    (SIDECAR_* variables pass through to the sleeve, so a bad one reaches the sidecar.)"""
    res = sleeve_proc(
        "run",
        "--project",
        project,
        "--runtime",
        "bwrap",
        "--shell",
        extra_env={"SIDECAR_RESTART": "sometimes"},
    )
    assert res.code == 1
    assert "exited during start-up" in res.err and "SIDECAR_RESTART" in res.err  # log's tail
    (run,) = json.loads(sleeve_proc("ps", "--json").out)
    assert (run["status"], run["exit_code"]) == ("failed (code 2)", 2)
    assert "failed (code 2)" in sleeve_proc("ps").out


@pytest.fixture
def etc_dir() -> Iterator[Path]:
    """A directory of the host's /etc, removed after the test (root only)."""
    try:
        made = Path(tempfile.mkdtemp(prefix="sleeve-test-", dir="/etc"))
    except PermissionError:
        pytest.skip("a directory in /etc needs root")
    made.chmod(0o755)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def test_bwrap_run_with_an_allowlist_closes_the_clis_network(
    project: Path, tmp_path: Path, sleeve_proc: Callable[..., Result], etc_dir: Path
) -> None:
    """In bubblewrap the CLI reaches a listed host through the proxy, and nothing around it:
    the egress guard holds there too (the probe CLI and its report are in the workspace). The
    CLI registry naming the probe is a file the agent cannot write (one in the workspace exits
    2): a directory of the host's /etc, which the sandbox binds read-only (an OS seam: the
    launcher has no option for a registry file, so the test puts one where the sandbox sees
    it)."""
    probe = Path(__file__).parent.parent / "clis" / "egress_probe.py"
    (project / "probe.py").write_text(probe.read_text())
    port = free_port()
    with web_server() as web:
        urls = [f"http://127.0.0.1:{web}/", "http://127.0.0.1:1/"]
        command = ["python3", "/workspace/probe.py", "/workspace/report.json", *urls]
        registry = etc_dir / "clis.yaml"
        registry.write_text(json.dumps({"clis": {"probe": {"command": command}}}))
        allow = tmp_path / "allow.txt"
        allow.write_text(f"127.0.0.1:{web}\n")
        args = ("run", "--project", str(project), "--runtime", "bwrap", "--cli", "probe")
        res = sleeve_proc(
            *args,
            "--port",
            str(port),
            "--egress",
            str(allow),
            "--wait",
            "40",
            extra_env={"SIDECAR_CLI_CONFIG": str(registry)},
        )
        try:
            assert res.code == 0, res.err
            report = project / "report.json"
            got = wait_for(
                lambda: json.loads(report.read_text()) if report.exists() else None,
                20,
                what="the probe's report",
            )
            assert got["results"][0] == [200, "hello"]
            assert got["results"][1][0] == 403
            assert got["direct"] == {"tcp": "EACCES", "udp": "EACCES", "ipv6": "EAFNOSUPPORT"}
        finally:
            sleeve_proc("stop", "1", "--project", str(project))
