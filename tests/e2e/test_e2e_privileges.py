"""Least privilege in the real image on a real (private) Docker engine.

- `sleeve run` by a non-root host user (made for the test): the container starts as root with
  `SIDECAR_USER=<uid>:<gid>`, `--cap-drop ALL` plus SETUID, SETGID and KILL and
  no-new-privileges; the CLI is that user, so what lands in the project is that user's; Claude
  Code takes `--dangerously-skip-permissions` (it refuses it as root); the API answers 401
  without the generated token and 200 with it.
- Those three capabilities are enough (the sleeve starts, runs and resleeves), and the sidecar
  refuses to start with any one of them missing.
- The image runs entirely as uid 1000 with no capability at all, read-only, the way the Helm
  chart's pod does (`--user 1000:1000 --cap-drop ALL --security-opt no-new-privileges
  --read-only`, /run and /tmp as tmpfs, /workspace and /home/sleeve as volumes).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

import psutil
import pytest

from sidecar.core.loopback import free_port
from tests.e2e import dockerenv
from tests.e2e.anthropic_stub import AnthropicStub, claude_json
from tests.e2e.conftest import cli_up, health_ok, keep_logs
from tests.e2e.hostusers import HostUser, launcher_for
from tests.e2e.ttyclient import TerminalClient
from tests.harness import http, wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

CAPS = ("SETUID", "SETGID", "KILL")
CAP_BITS = {"KILL": 5, "SETGID": 6, "SETUID": 7}


def _cap_eff(status: str) -> int:
    return int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("CapEff")), 16)


def _status(port: int, token: str | None) -> tuple[int, Any]:
    return http("GET", f"http://127.0.0.1:{port}/status", token=token)


def test_sleeve_run_by_a_host_user_runs_the_cli_as_that_user_and_closed(
    engine: dockerenv.Engine,
    image: str,
    stub: AnthropicStub,
    host_user: HostUser,
    artifacts: Path,
) -> None:
    lch = launcher_for(engine, host_user, stub)
    created = lch("create", "--json")
    assert created.returncode == 0, created.stderr
    slot = Path(json.loads(created.stdout)["folder"])
    # Past onboarding, and past the one-time "Bypass Permissions mode" question.
    seed = {**claude_json("/workspace"), "bypassPermissionsModeAccepted": True}
    (slot / ".claude.json").write_text(json.dumps(seed))
    os.chown(slot / ".claude.json", host_user.uid, host_user.gid)
    # The CLI registry is baked into an image of its own, root's (the sidecar refuses one the
    # agent could write, such as a file in the workspace; the launcher lets through a registry
    # that exists only in the image).
    registry = "clis:\n  claude-yolo:\n    command: [claude, --dangerously-skip-permissions]\n"
    ctx = host_user.home.parent / "registry-image"  # removed with the user
    ctx.mkdir()
    (ctx / "clis.yaml").write_text(registry)
    (ctx / "Dockerfile").write_text(f"FROM {image}\nCOPY clis.yaml /etc/sleeve-test/clis.yaml\n")
    yolo = "sleeve-e2e-registry:latest"
    engine.docker("build", "-q", "-t", yolo, str(ctx), timeout=300)
    lch.env["SIDECAR_CLI_CONFIG"] = "/etc/sleeve-test/clis.yaml"
    port = free_port()
    run = lch(
        "run", "--runtime", "docker", "--network", "host", "--image", yolo, "--port", str(port),
        "--cli", "claude-yolo", "--goal", "Least privilege", timeout=120,
    )  # fmt: skip
    container = None
    try:
        assert run.returncode == 0, run.stderr
        url, _, token = run.stdout.strip().rsplit(" ", 1)[1].partition("?token=")
        assert url == f"http://127.0.0.1:{port}/" and len(token) >= 32
        (record,) = json.loads(lch("ps", "--json").stdout)
        container = record["container"]
        assert record["token"] == token
        # Closed: nothing but /health without the generated token.
        assert health_ok(port)
        assert _status(port, None)[0] == 401
        assert _status(port, "not-the-token")[0] == 401
        status = wait_for(lambda: cli_up(port, token, "claude-yolo"), 30, what="claude running")
        # The token is in no argv and no environment the engine shows.
        inspect = engine.docker("inspect", container).stdout
        assert token not in inspect
        config = json.loads(inspect)[0]
        assert config["HostConfig"]["CapDrop"] == ["ALL"]
        assert sorted(config["HostConfig"]["CapAdd"]) == sorted(f"CAP_{c}" for c in CAPS) or (
            sorted(config["HostConfig"]["CapAdd"]) == sorted(CAPS)
        )
        assert "no-new-privileges" in config["HostConfig"]["SecurityOpt"]
        # PID 1 (the sidecar) is root with the three capabilities; the CLI is the host user.
        pid1 = engine.docker("exec", container, "cat", "/proc/1/status").stdout
        assert _cap_eff(pid1) == sum(1 << CAP_BITS[c] for c in CAPS)
        cli = engine.docker("exec", container, "cat", f"/proc/{status['cli_pid']}/status").stdout
        uid_line = next(ln for ln in cli.splitlines() if ln.startswith("Uid:")).split()[1:]
        assert uid_line == [str(host_user.uid)] * 4 and _cap_eff(cli) == 0
        # Claude Code took --dangerously-skip-permissions (as root it would have exited 1).
        screen = _terminal_text(port, token, "bypass permissions", 40, artifacts)
        assert "root/sudo" not in screen
        assert cli_up(port, token, "claude-yolo", None)
        # What lands in the project is the user's: the CLI's own files and the sidecar's.
        code, _ = http(
            "POST", f"{url}inbox", {"from": "t", "type": "task", "content": "x"}, token=token
        )
        assert code == 201
        code, _ = http("POST", f"{url}resleeve", {"cli": "shell"}, token=token)
        assert code == 202
        wait_for(lambda: cli_up(port, token, "shell", status["cli_pid"]), 30, what="the shell")
        _terminal_type(port, token, "touch made-by-cli; mkdir -p made-dir/sub\r")
        wait_for(lambda: (lch.project / "made-dir" / "sub").is_dir(), 20, what="the CLI's files")
        for rel in ("made-by-cli", "made-dir", "made-dir/sub", ".needlecast",
                    ".needlecast/inbox.md", ".cstack", ".cstack/CURRENT.md"):  # fmt: skip
            st = (lch.project / rel).stat()
            assert (st.st_uid, st.st_gid) == (host_user.uid, host_user.gid), rel
        stop = lch("stop", "1")
        assert stop.returncode == 0, stop.stderr
        st = (lch.project / ".cstack" / "CURRENT.md").stat()
        assert "killed" in (lch.project / ".cstack" / "CURRENT.md").read_text()
        assert (st.st_uid, st.st_gid) == (host_user.uid, host_user.gid)
        owned = [p for p in lch.project.rglob("*") if p.stat().st_uid != host_user.uid]
        assert owned == [], f"not the user's: {owned}"
    finally:
        if container is not None:
            keep_logs(engine, container)
            engine.docker("rm", "-f", container, check=False)


def _terminal_text(port: int, token: str, needle: str, timeout: float, artifacts: Path) -> str:
    import asyncio

    async def look() -> str:
        term = await TerminalClient.connect(f"ws://127.0.0.1:{port}/terminal/ws?token={token}")
        try:
            await term.wait_for("Claude Code", timeout)
            try:
                await term.wait_for(needle, 15)
            finally:
                (artifacts / "privileges-claude-screen.txt").write_text(term.text)
            return term.text
        finally:
            await term.close()

    return asyncio.run(look())


def _terminal_type(port: int, token: str, text: str) -> None:
    import asyncio

    async def typed() -> None:
        term = await TerminalClient.connect(f"ws://127.0.0.1:{port}/terminal/ws?token={token}")
        try:
            await term.wait_for("$", 15)
            await term.type(text)
            await term.wait_for(text.strip()[:20], 10)
        finally:
            await term.close()

    asyncio.run(typed())


def _run_as_root_with(
    engine: dockerenv.Engine, image: str, name: str, caps: tuple[str, ...]
) -> int:
    port = free_port()
    argv = ["run", "--detach", "--name", name, "--network", "host", "--user", "0:0"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    for cap in caps:
        argv += ["--cap-add", cap]
    argv += ["--env", f"SLEEVE_NAME={name}", "--env", "SLEEVE_CLI=shell"]
    argv += ["--env", "SIDECAR_HOST=127.0.0.1", "--env", f"SIDECAR_PORT={port}"]
    argv += ["--env", "SIDECAR_USER=sleeve", image]
    engine.docker(*argv)
    return port


def test_setuid_setgid_and_kill_are_enough_and_each_is_needed(
    engine: dockerenv.Engine, image: str
) -> None:
    name = "e2e-caps"
    port = _run_as_root_with(engine, image, name, CAPS)
    try:
        first = wait_for(lambda: cli_up(port, "", "shell"), 20, what="the shell as sleeve")
        top = engine.docker("exec", name, "ps", "-eo", "uid=,args=").stdout
        users = {line.split(None, 1)[1]: line.split()[0] for line in top.splitlines()}
        assert any(u == "1000" and "bash" in a for a, u in users.items()), top
        assert any(u == "1000" and "ttyd" in a for a, u in users.items()), top
        # A resleeve stops the user's tree (KILL) and starts the next as the user (SETUID).
        assert http("POST", f"http://127.0.0.1:{port}/resleeve", {}, token=None)[0] == 202
        wait_for(lambda: cli_up(port, "", "shell", first["cli_pid"]), 20, what="the shell again")
        engine.docker("stop", "--time", "10", name)
        code = engine.docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0"
    finally:
        keep_logs(engine, name)
        engine.docker("rm", "-f", name, check=False)
    for missing in CAPS:
        fewer = tuple(c for c in CAPS if c != missing)
        name = f"e2e-caps-no-{missing.lower()}"
        _run_as_root_with(engine, image, name, fewer)
        try:

            def exited(n: str = name) -> str | None:
                fmt = "{{.State.Status}} {{.State.ExitCode}}"
                out = engine.docker("inspect", "--format", fmt, n).stdout.split()
                return out[1] if out[0] == "exited" else None

            assert wait_for(exited, 20, what=f"the sidecar without {missing} to exit") == "2"
            logs = engine.docker("logs", name).stderr
            assert f"--cap-add {missing}" in logs, logs
        finally:
            keep_logs(engine, name)
            engine.docker("rm", "-f", name, check=False)


def test_the_image_runs_entirely_as_1000_without_capabilities_read_only(
    engine: dockerenv.Engine, image: str, tmp_path: Path
) -> None:
    """The Helm chart's pod, in Docker: uid/gid 1000, no capability, no privilege escalation,
    a read-only root; /run and /tmp tmpfs, the workspace and HOME volumes, the token a file."""
    name, port, token = "e2e-as-1000", free_port(), "t-" + secrets.token_hex(16)
    secret_dir = tmp_path / "tokens"
    secret_dir.mkdir()
    (secret_dir / "token").write_text(token + "\n")
    os.chown(secret_dir / "token", 1000, 1000)
    (secret_dir / "token").chmod(0o400)
    tmp_path.chmod(0o755)
    volumes = [f"{name}-ws", f"{name}-home"]
    argv = ["run", "--detach", "--name", name, "--network", "host", "--user", "1000:1000"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only"]
    argv += ["--tmpfs", "/run", "--tmpfs", "/tmp"]
    argv += ["--volume", f"{volumes[0]}:/workspace", "--volume", f"{volumes[1]}:/home/sleeve"]
    argv += ["--mount", f"type=bind,source={secret_dir},target=/etc/sleeve/tokens,readonly"]
    argv += ["--env", f"SLEEVE_NAME={name}", "--env", "SLEEVE_CLI=shell"]
    argv += ["--env", "SIDECAR_HOST=127.0.0.1", "--env", f"SIDECAR_PORT={port}"]
    argv += ["--env", "SIDECAR_TOKEN_FILE=/etc/sleeve/tokens/token", "--env", "SLEEVE_GOAL=ro"]
    engine.docker(*argv, image)
    try:

        def answers() -> dict[str, Any] | None:
            if body := health_ok(port):
                return body
            state = engine.docker("inspect", "--format", "{{.State.Status}}", name).stdout
            assert state.strip() == "running", engine.docker("logs", name).stderr
            return None

        wait_for(answers, 20, what="/health")
        assert _status(port, None)[0] == 401
        status = wait_for(lambda: cli_up(port, token, "shell"), 20, what="the shell as 1000")
        assert status["warnings"] == []
        message = {"from": "t", "type": "task", "content": "x"}
        assert http("POST", f"http://127.0.0.1:{port}/inbox", message, token=token)[0] == 201
        table = engine.docker("exec", name, "ps", "-eo", "uid=,args=").stdout
        assert {line.split()[0] for line in table.splitlines()} == {"1000"}, table
        for pid in ("1", str(status["cli_pid"])):
            proc = engine.docker("exec", name, "cat", f"/proc/{pid}/status").stdout
            assert _cap_eff(proc) == 0
        engine.docker("stop", "--time", "10", name)
        code = engine.docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        assert code == "0", engine.docker("logs", name).stderr
    finally:
        keep_logs(engine, name)
        engine.docker("rm", "-f", name, check=False)
        engine.docker("volume", "rm", *volumes, check=False)


def test_a_token_in_no_process_of_a_container_run_with_sidecar_token_in_its_env(
    engine: dockerenv.Engine, image: str
) -> None:
    """`docker run -e SIDECAR_TOKEN=...` (the value in the container's config): once running,
    no process in the container shows it in /proc/<pid>/environ or cmdline, PID 1 included."""
    name, port, token = "e2e-env-token", free_port(), "env-" + secrets.token_hex(16)
    argv = ["run", "--detach", "--name", name, "--network", "host", "--user", "0:0"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
    for cap in CAPS:
        argv += ["--cap-add", cap]
    argv += ["--env", f"SLEEVE_NAME={name}", "--env", "SLEEVE_CLI=shell"]
    argv += ["--env", "SIDECAR_USER=sleeve"]
    argv += ["--env", "SIDECAR_HOST=127.0.0.1", "--env", f"SIDECAR_PORT={port}"]
    argv += ["--env", f"SIDECAR_TOKEN={token}", image]
    engine.docker(*argv)
    try:
        wait_for(lambda: cli_up(port, token, "shell"), 20, what="the shell")
        # Read from the host, as root with every capability (the sidecar makes itself
        # non-dumpable when it acts as the user, so in the container even root would need
        # CAP_SYS_PTRACE): every process of the container, PID 1 first.
        pid1 = int(engine.docker("inspect", "--format", "{{.State.Pid}}", name).stdout)
        procs = [psutil.Process(pid1), *psutil.Process(pid1).children(recursive=True)]
        assert len(procs) >= 5  # init, supervisor, tmux, ttyd, the CLI (and its waiter)
        for proc in procs:
            for what in ("environ", "cmdline"):
                data = Path(f"/proc/{proc.pid}/{what}").read_bytes()
                assert token.encode() not in data, (proc.cmdline()[:3], what)
    finally:
        keep_logs(engine, name)
        engine.docker("rm", "-f", name, check=False)
