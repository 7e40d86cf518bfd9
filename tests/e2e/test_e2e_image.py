"""The image itself, on a real (private) Docker engine: what it contains, how it starts, how it
is rebuilt, and the build/run mistakes a user makes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.core.loopback import free_ports
from sidecar.pane import tmux_version
from tests.e2e import dockerenv
from tests.e2e.conftest import SLEEVE, health_ok, sleeve_env
from tests.harness import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]


def _docker_run(
    engine: dockerenv.Engine, image: str, name: str, *extra: str, cli: str = "shell"
) -> int:
    """`docker run -d --network host` of the image with the shell CLI; returns the API port."""
    port, ttyd_port = free_ports(2)
    engine.docker(
        "run", "--detach", "--name", name, "--network", "host",
        "--env", f"SLEEVE_NAME={name}", "--env", f"SLEEVE_CLI={cli}",
        "--env", "SIDECAR_HOST=127.0.0.1", "--env", f"SIDECAR_PORT={port}",
        "--env", f"TTYD_PORT={ttyd_port}",
        *extra, image,
    )  # fmt: skip
    return port


def _context_copy(dest: Path) -> Path:
    """A copy of the build context (the paths .dockerignore lets through), to change freely."""
    repo = dockerenv.REPO
    dest.mkdir(exist_ok=True)
    shutil.copy2(repo / ".dockerignore", dest / ".dockerignore")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for line in (repo / ".dockerignore").read_text().splitlines():
        if not line.startswith("!"):
            continue
        src, target = repo / line[1:].rstrip("/"), dest / line[1:].rstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=ignore)
        else:
            shutil.copy2(src, target)  # keeps the mode: scripts/build-tmux runs as it is
    return dest


def _steps_run_again(build_output: str) -> list[str]:
    """The classic builder's `Step N/M : RUN ...` lines that did not come from the cache."""
    chunks = build_output.split("Step ")[1:]
    return [
        c.splitlines()[0]
        for c in chunks
        if " : RUN " in c.splitlines()[0] and "Using cache" not in c
    ]


def test_image_has_entrypoint_healthcheck_and_pinned_parts(
    engine: dockerenv.Engine, image: str
) -> None:
    """The runtime contract of the image: sidecar as entrypoint, only 8080 exposed, SIGTERM,
    a /health check with the seed's timings, the pinned Claude Code and ttyd inside, and a tmux
    of 3.5 or later built with our patch (its drawing code does not exit on a small client, a
    respawn does not crash its server: docs/tmux.md)."""
    fmt = (
        "{{json .Config.Entrypoint}}|{{json .Config.ExposedPorts}}|{{.Config.StopSignal}}|"
        "{{.Config.WorkingDir}}|{{json .Config.Healthcheck}}"
    )
    entry, ports, stop, workdir, health = (
        engine.docker("image", "inspect", "--format", fmt, image).stdout.strip().split("|")
    )
    assert entry == '["sidecar"]'
    assert ports == '{"8080/tcp":{}}'
    assert stop == "SIGTERM"
    assert workdir == "/workspace"
    assert '"Interval":30000000000' in health and '"Timeout":10000000000' in health
    assert '"StartPeriod":60000000000' in health and '"Retries":3' in health
    labels = dockerenv.image_labels(engine, image)
    assert labels["io.sleeve.claude-code.version"] == "2.1.330"
    assert labels["io.sleeve.ttyd.version"] == "1.7.7"
    assert labels.get("sleeve.inputs"), "sleeve build labels the image with its inputs checksum"
    out = engine.docker(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
        "claude --version; ttyd --version; git --version; python3 --version; "
        "grep -a -o -F 'too big, %u > %u; not drawn' \"$(command -v tmux)\" | wc -l; "
        "grep -a -o -F 'respawned, its offsets start afresh' \"$(command -v tmux)\" | wc -l; "
        "tmux -V",
    ).stdout  # fmt: skip
    assert "2.1.330 (Claude Code)" in out
    assert "ttyd version 1.7.7" in out
    assert "git version" in out and "Python 3.13" in out
    drawing, respawn, tmux = out.strip().splitlines()[-3:]
    assert (tmux_version.parse(tmux) or (0, 0)) >= (3, 5), tmux
    assert drawing == "2", "the patch's x and y messages are in the image's tmux"
    assert respawn == "1", "the patch's respawn message is in the image's tmux"


def test_an_image_with_codex_runs_it_and_has_no_claude_code_or_node(
    engine: dockerenv.Engine, image: str, tmp_path: Path, timings: dict[str, float]
) -> None:
    """`sleeve build --clis codex`: Codex at its pinned version from image/clis/codex's lock, run
    as the image's user; the CLIs not asked for are not there. Built after the default image,
    so only the CLI stages and the last layers run."""
    tag = "sleeve-e2e-codex:latest"
    other = os.environ.get("SLEEVE_E2E_CONTEXT")
    argv = [str(SLEEVE), "build", "--image", tag, "--clis", "codex"]
    argv += ["--context", other] if other else []
    env = sleeve_env(engine, tmp_path / "home")
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    timings["image_build_codex"] = round(time.monotonic() - t0, 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    try:
        size = engine.docker("image", "inspect", "--format", "{{.Size}}", tag).stdout
        timings["image_codex_size_mb"] = round(int(size) / 1e6, 1)
        assert dockerenv.image_labels(engine, tag)["io.sleeve.clis"] == "codex"
        out = engine.docker(
            "run", "--rm", "--network", "none", "--entrypoint", "sh", tag, "-c",
            "codex --version; id -un; for c in claude node gemini opencode; do"
            " command -v $c || echo no-$c; done",
        ).stdout.split()  # fmt: skip
        assert out == ["codex-cli", "0.169.0", "sleeve", "no-claude", "no-node", "no-gemini",
                       "no-opencode"]  # fmt: skip
    finally:
        engine.docker("rmi", "-f", tag, check=False)


def test_a_build_naming_an_unknown_cli_fails_naming_the_known_ones(
    engine: dockerenv.Engine, base_image: str, tmp_path: Path
) -> None:
    ctx = _context_copy(tmp_path)
    out = _failed_build(engine, tmp_path, ctx, "CLIS=claude-code claude")
    assert "CLIS: no CLI 'claude' (known: claude-code codex gemini-cli opencode)" in out


def test_second_sleeve_build_is_skipped_by_the_checksum_label(
    engine: dockerenv.Engine, image: str, tmp_path: Path, timings: dict[str, float]
) -> None:
    """Built from a snapshot of the context: other work in the checkout cannot change it."""
    ctx = _context_copy(tmp_path / "ctx")
    env = sleeve_env(engine, tmp_path / "home")
    argv = [str(SLEEVE), "build", "--image", "sleeve-e2e-skip:latest", "--context", str(ctx)]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    t0 = time.monotonic()
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    timings["image_build_unchanged"] = elapsed = round(time.monotonic() - t0, 2)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout, again.stdout[-2000:]
    assert elapsed < 10
    engine.docker("rmi", "sleeve-e2e-skip:latest", check=False)


def test_sidecar_only_change_rebuilds_without_reinstalling_node_or_the_cli(
    engine: dockerenv.Engine, image: str, tmp_path: Path, timings: dict[str, float]
) -> None:
    """Layer order: a changed sidecar file re-runs only the last steps (target ≤30 s)."""
    ctx = _context_copy(tmp_path)
    env = sleeve_env(engine, tmp_path / "home")
    tag = "sleeve-e2e-rebuild:latest"
    first = subprocess.run(
        [str(SLEEVE), "build", "--image", tag, "--context", str(ctx)],
        env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr
    with (ctx / "sidecar" / "__init__.py").open("a") as fh:
        fh.write("\n# a sidecar-only change\n")
    t0 = time.monotonic()
    second = subprocess.run(
        [str(SLEEVE), "build", "--image", tag, "--context", str(ctx)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    timings["image_rebuild_sidecar_change"] = elapsed = round(time.monotonic() - t0, 2)
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr
    reran = _steps_run_again(second.stdout)
    assert reran, "the changed sidecar file must be picked up"
    slow = [s for s in reran if any(w in s for w in ("apt-get", "npm install", "-r /tmp/req"))]
    assert not slow, f"a sidecar-only change re-ran: {slow}"
    assert elapsed <= 30, f"sidecar-only rebuild took {elapsed} s"
    engine.docker("rmi", "-f", tag, check=False)


def test_build_without_network_or_vendored_ttyd_fails_naming_what_to_set(
    engine: dockerenv.Engine, base_image: str, tmp_path: Path
) -> None:
    """No image/vendor/ttyd.x86_64 and upstream unreachable: the error says which file or ARG.
    (A dead loopback URL stands for unreachable upstream, whatever this machine can reach.)"""
    ctx = _context_copy(tmp_path)
    (ctx / "image" / "vendor" / "ttyd.x86_64").unlink(missing_ok=True)
    out = _failed_build(engine, tmp_path, ctx, "TTYD_URL=http://127.0.0.1:9/ttyd.x86_64")
    assert "could not download http://127.0.0.1:9/ttyd.x86_64" in out
    assert "image/vendor/ttyd.x86_64" in out
    assert "TTYD_URL" in out


def test_a_vendored_ttyd_with_the_wrong_sha256_fails_the_build(
    engine: dockerenv.Engine, base_image: str, tmp_path: Path
) -> None:
    ctx = _context_copy(tmp_path)
    (ctx / "image" / "vendor" / "ttyd.x86_64").write_bytes(b"#!/bin/sh\necho not ttyd\n")
    out = _failed_build(engine, tmp_path, ctx)
    assert "expected 8a217c968aba172e0dbf3f34447218dc015bc4d5e59bf51db2f2cd12b7be4f55" in out
    assert "TTYD_SHA256" in out


def _failed_build(engine: dockerenv.Engine, tmp_path: Path, ctx: Path, *build_args: str) -> str:
    argv = [str(SLEEVE), "build", "--image", "sleeve-e2e-nottyd:latest", "--context", str(ctx)]
    for arg in build_args:
        argv += ["--build-arg", arg]
    env = sleeve_env(engine, tmp_path / "home")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0, "the build must fail"
    return proc.stdout + proc.stderr


def test_cold_docker_run_answers_health_quickly_as_pid_1_and_turns_healthy(
    engine: dockerenv.Engine, image: str, timings: dict[str, float]
) -> None:
    """Cold `docker run` → /health 200 (target ≤1.5 s); PID 1 is the sidecar; Docker's own
    HEALTHCHECK (short interval for the test) reports `healthy`."""
    t0 = time.monotonic()
    port = _docker_run(
        engine, image, "e2e-cold", "--health-interval", "1s", "--health-start-period", "30s"
    )
    wait_for(lambda: health_ok(port), 10, what="/health 200", interval=0.02)
    timings["cold_run_health"] = elapsed = round(time.monotonic() - t0, 2)
    comm = engine.docker("exec", "e2e-cold", "cat", "/proc/1/cmdline").stdout.split("\0")
    assert any(part.endswith("sidecar") for part in comm[:2]), comm
    wait_for(
        lambda: (
            engine.docker(
                "inspect", "--format", "{{.State.Health.Status}}", "e2e-cold"
            ).stdout.strip()
            == "healthy"
        ),
        20,
        what="docker health status healthy",
        interval=0.2,
    )
    engine.docker("rm", "-f", "e2e-cold")
    # The 1.5 s target holds on an idle machine; when other work keeps every core busy the
    # start is only held to twice that, so the test proves the target without flaking.
    busy = os.getloadavg()[0] > (os.cpu_count() or 1)
    bound = 3.0 if busy else 1.5
    assert elapsed <= bound, f"cold docker run to /health 200 took {elapsed} s (busy={busy})"


def test_unknown_cli_keeps_container_running_with_health_degraded_and_says_why(
    engine: dockerenv.Engine, image: str
) -> None:
    port = _docker_run(engine, image, "e2e-nocli", cli="no-such-cli")

    def state() -> str:
        fmt = "{{.State.Status}}"
        return engine.docker("inspect", "--format", fmt, "e2e-nocli").stdout.strip()

    try:
        wait_for(lambda: health_ok(port) or state() == "exited", 15, what="/health 200 or an exit")
        logs = engine.docker("logs", "e2e-nocli")
        assert "no-such-cli" in logs.stdout + logs.stderr
        assert state() == "running", f"the container exited: {logs.stderr.strip()}"
        body = health_ok(port)
        assert body is not None and body["status"] == "degraded"
    finally:
        engine.docker("rm", "-f", "e2e-nocli", check=False)
