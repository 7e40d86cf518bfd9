"""Fixtures for the end-to-end tests: a private Docker engine, the image, the `sleeve` launcher.

Expensive parts are made once per run, before the first test that needs them (`Prepared`), and
cached on disk between runs (see `dockerenv`). The engine is stopped by its pid at the end, and
every container it ran is removed first, even when a test fails. Without a usable engine (or
debootstrap for the base image, or the vendored ttyd) the tests skip on a developer machine and
FAIL in CI, by the rule of tests/tools.py: CI must never go green by not running them.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests.e2e import dockerenv
from tests.e2e.anthropic_stub import TEST_API_KEY, AnthropicStub, claude_json
from tests.e2e.hostusers import HostUser
from tests.harness import Reply, http
from tests.tools import missing

IMAGE = "sleeve-e2e:latest"
# Sleeves are closed by default; the e2e launcher gives this one as its own token (`sleeve run`
# uses a caller's SIDECAR_TOKEN), and `Sleeve.get`/`post` send it.
# (tests/e2e/test_e2e_privileges.py proves the generated one.)
E2E_TOKEN = "e2e-token-0123456789abcdef0123456789"
ARTIFACTS = dockerenv.REPO / "artifacts" / "e2e"
# `docker run` as the Helm chart's pod runs the image: one uid, no capability, no privilege
# escalation, a read-only root with /run and /tmp as tmpfs.
POD = ["--user", "1000:1000", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
POD += ["--read-only", "--tmpfs", "/run", "--tmpfs", "/tmp"]
SLEEVE = Path(sys.executable).parent / "sleeve"


class Prepared:
    """The engine, the base image and the image under test, each made once per run: before the
    first test that needs them (`pytest_collection_finish`), else by the first fixture that
    asks. A cold image build takes minutes; made in a fixture's setup, it would count against
    pytest-timeout's limit of whichever test happened to ask first. What failed is kept and
    raised again to every test that needs it."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()  # closed at the session's end
        self.timings: dict[str, float] = {}
        self._made: dict[str, tuple[Any, BaseException | None]] = {}

    def _once(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self._made:
            try:
                self._made[name] = (make(), None)
            except Exception as exc:  # raised again below, to each test that needs it
                self._made[name] = (None, exc)
        value, error = self._made[name]
        if error is not None:
            raise error
        return value

    def engine(self) -> dockerenv.Engine:
        return cast(dockerenv.Engine, self._once("engine", self._start_engine))

    def base_image(self) -> str:
        return cast(str, self._once("base_image", self._make_base_image))

    def image(self) -> str:
        return cast(str, self._once("image", self._build_image))

    def _start_engine(self) -> dockerenv.Engine:
        cache = dockerenv.cache_root()
        self.stack.enter_context(dockerenv.file_lock(cache / "engine.lock"))
        t0 = time.monotonic()
        eng = dockerenv.start_engine(cache / "engine")
        self.timings["engine_start"] = round(time.monotonic() - t0, 2)
        self.stack.callback(eng.stop)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.stack.callback(_save_logs_and_remove_containers, eng)
        dockerenv.remove_all_containers(eng)
        return eng

    def _make_base_image(self) -> str:
        eng = self.engine()
        t0 = time.monotonic()
        how = dockerenv.ensure_base_image(eng)
        self.timings[f"base_image_{how}"] = round(time.monotonic() - t0, 2)
        return dockerenv.BASE_IMAGE

    def _build_image(self) -> str:
        """`sleeve build` of image/Dockerfile, as a user runs it (warm: skipped by its
        checksum). SLEEVE_E2E_CONTEXT builds another checkout instead (e.g. a clean
        `git worktree`)."""
        eng, _ = self.engine(), self.base_image()
        dockerenv.prepare_context()
        home = Path(self.stack.enter_context(tempfile.TemporaryDirectory(prefix="build-home-")))
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(SLEEVE), *build_args()],
            env=sleeve_env(eng, home),
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        elapsed = round(time.monotonic() - t0, 2)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        (ARTIFACTS / "sleeve-build.log").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            msg = f"sleeve build failed:\n{proc.stdout[-3000:]}{proc.stderr}"
            raise ImageBuildError(msg)
        skipped = "up to date" in proc.stdout
        self.timings["image_build_skipped" if skipped else "image_build"] = elapsed
        size = eng.docker("image", "inspect", "--format", "{{.Size}}", IMAGE).stdout
        self.timings["image_size_mb"] = round(int(size) / 1e6, 1)
        return IMAGE


class ImageBuildError(Exception):
    """`sleeve build` of the image under test failed."""


PREPARED = Prepared()
# What each of the fixtures below needs made first, in order.
NEEDS = {
    "engine": ("engine",),
    "base_image": ("engine", "base_image"),
    "image": ("engine", "base_image", "image"),
}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Make what the selected tests need, once they are known and before the first runs."""
    if session.config.option.collectonly:
        return
    wanted = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    steps = [step for fixture, steps in NEEDS.items() if fixture in wanted for step in steps]
    for step in dict.fromkeys(steps):  # in order, each once
        with contextlib.suppress(Exception):  # kept by Prepared: each test that needs it says
            getattr(PREPARED, step)()


def pytest_sessionfinish(session: pytest.Session) -> None:
    PREPARED.stack.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def timings(artifacts: Path) -> Iterator[dict[str, float]]:
    """Measured durations (seconds), written to artifacts/e2e/timings.json at the end."""
    found: dict[str, float] = {}
    start = time.monotonic()
    yield found
    found.update(PREPARED.timings)
    found["session"] = round(time.monotonic() - start, 2)
    (artifacts / "timings.json").write_text(json.dumps(found, indent=2) + "\n")


@pytest.fixture(scope="session")
def engine() -> dockerenv.Engine:
    try:
        return PREPARED.engine()
    except dockerenv.EngineUnavailableError as exc:
        missing(f"no Docker engine: {exc}")


def _save_logs_and_remove_containers(eng: dockerenv.Engine) -> None:
    """Keep each container's log as an artifact (`keep_logs`), then remove them all."""
    for name in eng.docker("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split():
        keep_logs(eng, name)
    dockerenv.remove_all_containers(eng)
    # Superseded builds pile up in the cached data-root. Not all dangling images are garbage:
    # the classic builder keeps the ttyd and claude build stages as untagged images, and they
    # are the cache that makes a sidecar-only rebuild take seconds. Only week-old ones go.
    eng.docker("image", "prune", "--force", "--filter", "until=168h", check=False, timeout=120)


@pytest.fixture(scope="session")
def base_image(engine: dockerenv.Engine) -> str:
    try:
        return PREPARED.base_image()
    except dockerenv.EngineUnavailableError as exc:  # debootstrap is not installed
        missing(f"no base image: {exc}")


def sleeve_env(engine: dockerenv.Engine, home: Path, stub_url: str = "") -> dict[str, str]:
    """The environment a user would have: DOCKER_HOST set, an API key, their own SLEEVE_HOME."""
    env = engine.env({"SLEEVE_HOME": str(home), "ANTHROPIC_API_KEY": TEST_API_KEY})
    for key in list(env):  # nothing of the test runner's own sleeve settings leaks in
        if key.startswith(("SLEEVE_", "SIDECAR_")) and key != "SLEEVE_HOME":
            del env[key]
    if stub_url:
        env["ANTHROPIC_BASE_URL"] = stub_url
    return env


def build_args() -> list[str]:
    """`sleeve build` arguments for the image under test (SLEEVE_E2E_CONTEXT: another checkout)."""
    other = os.environ.get("SLEEVE_E2E_CONTEXT")
    return ["build", "--image", IMAGE, *(["--context", other] if other else [])]


@pytest.fixture(scope="session")
def image(base_image: str) -> str:
    """The image under test (`Prepared._build_image`)."""
    try:
        return PREPARED.image()
    except FileNotFoundError as exc:  # the dev extras' ttyd is not installed
        missing(str(exc))
    except ImageBuildError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def stub() -> Iterator[AnthropicStub]:
    with AnthropicStub() as s:
        yield s


def health_ok(port: int) -> dict[str, Any] | None:
    try:
        status, body = http("GET", f"http://127.0.0.1:{port}/health", timeout=1)
    except OSError:
        return None
    return body if status == 200 else None


def cli_up(port: int, token: str, cli: str, not_pid: int | None = None) -> dict[str, Any] | None:
    """/status of the sleeve on `port` once `cli` runs with a pid other than `not_pid`; None
    before, and while the sleeve does not answer yet."""
    try:
        code, s = http("GET", f"http://127.0.0.1:{port}/status", token=token)
    except OSError:
        return None
    if code == 200 and s["cli"] == cli and s["cli_running"] and s["cli_pid"] not in (None, not_pid):
        return dict(s)
    return None


def probe_run(name: str, port: int, tools: Path, allow: str, *where: str) -> list[str]:
    """`docker run` arguments (the image aside) of sleeve `name` on `port` whose CLI is `probe`
    from the registry `tools`/clis.yaml (a directory of root's, mounted read-only at
    /opt/tools: the sidecar trusts it), its workspace the volume `name`-ws, its egress allowlist
    `allow`; `where`: how and with what else it runs."""
    argv = ["run", "--detach", "--name", name, "--network", "host", *where]
    argv += ["--volume", f"{name}-ws:/workspace"]
    argv += ["--mount", f"type=bind,source={tools},target=/opt/tools,readonly"]
    argv += ["--env", f"SLEEVE_NAME={name}", "--env", "SLEEVE_CLI=probe"]
    argv += ["--env", "SIDECAR_CLI_CONFIG=/opt/tools/clis.yaml"]
    argv += ["--env", "SIDECAR_HOST=127.0.0.1", "--env", f"SIDECAR_PORT={port}"]
    return [*argv, "--env", f"SIDECAR_EGRESS_ALLOW={allow}"]


def keep_logs(engine: dockerenv.Engine, name: str) -> str:
    """Container `name`'s log, kept as an artifact (the first thing to read when a test
    failed)."""
    logs = engine.docker("logs", name, check=False)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"container-{name}.log").write_text(logs.stdout + logs.stderr)
    return logs.stdout + logs.stderr


# --- the launcher, driven like a user ------------------------------------------------------


@dataclass
class Sleeve:
    """One running sleeve as `sleeve run` reported it."""

    slot: int
    port: int
    container: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kw: Any) -> Reply:
        return http("GET", self.url + path, token=E2E_TOKEN, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return http("POST", self.url + path, body, token=E2E_TOKEN, **kw)

    def status(self) -> dict[str, Any]:
        code, body = self.get("/status")
        assert code == 200, body
        return dict(body)

    def cli_up(self, cli: str, not_pid: int | None = None) -> dict[str, Any] | None:
        return cli_up(self.port, E2E_TOKEN, cli, not_pid)


@dataclass
class Launcher:
    """Runs the real `sleeve` console script for one project under its own SLEEVE_HOME."""

    engine: dockerenv.Engine
    home: Path
    project: Path
    env: dict[str, str]
    started: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SLEEVE), *args],
            env=self.env,
            cwd=self.project,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def create_slot(self, *, seed_claude: bool = True) -> Path:
        """`sleeve create`; the slot's `.claude.json` gets past onboarding (REAL-PARTS.md)."""
        proc = self("create", "--json")
        assert proc.returncode == 0, proc.stderr
        folder = Path(json.loads(proc.stdout)["folder"])
        if seed_claude:
            (folder / ".claude.json").write_text(json.dumps(claude_json("/workspace")))
        return folder

    def run(self, *args: str, cli: str = "claude-code", image: str = IMAGE) -> Sleeve:
        proc = self(
            "run", "--runtime", "docker", "--network", "host", "--image", image, "--cli", cli,
            *args, timeout=90,
        )  # fmt: skip
        assert proc.returncode == 0, f"sleeve run failed ({proc.returncode}): {proc.stderr}"
        runs = [r for r in self.ps() if r.get("status") == "running"]
        mine = max(runs, key=lambda r: r.get("started_at") or 0)
        sleeve = Sleeve(slot=int(mine["slot"]), port=int(mine["port"]), container=mine["container"])
        self.started.append(sleeve.container)
        return sleeve

    def ps(self) -> list[dict[str, Any]]:
        proc = self("ps", "--json")
        assert proc.returncode == 0, proc.stderr
        return list(json.loads(proc.stdout))

    def exec(
        self, sleeve: Sleeve, *argv: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.engine.docker("exec", sleeve.container, *argv, check=check)


def new_launcher(engine: dockerenv.Engine, stub: AnthropicStub | None, base: Path) -> Launcher:
    """A fresh git project under `base` with its own SLEEVE_HOME, pointed at the API stub."""
    project = base / "project"
    project.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    home = base / "sleeve-home"
    env = {**sleeve_env(engine, home, stub.url if stub else ""), "SIDECAR_TOKEN": E2E_TOKEN}
    return Launcher(engine, home, project, env)


def remove_started(lch: Launcher) -> None:
    """Remove the containers `lch` started, keeping their logs as artifacts."""
    for name in lch.started:
        keep_logs(lch.engine, name)
        lch.engine.docker("rm", "-f", name, check=False)


def processes(lch: Launcher, sleeve: Sleeve) -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command) inside the container, read with procps' ps."""
    out = lch.exec(sleeve, "ps", "-eo", "pid=,ppid=,args=").stdout
    table: dict[int, tuple[int, str]] = {}
    for line in out.splitlines():
        pid, ppid, *args = line.split(None, 2)
        table[int(pid)] = (int(ppid), args[0] if args else "")
    return table


def descendants(table: dict[int, tuple[int, str]], root: int) -> set[int]:
    found = {root}
    grew = True
    while grew:
        new = {pid for pid, (ppid, _) in table.items() if ppid in found} - found
        grew = bool(new)
        found |= new
    return found


@pytest.fixture
def host_user() -> Iterator[HostUser]:
    if os.geteuid() != 0:
        pytest.skip("making a host user needs root")
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    uid = next(n for n in range(23100, 23900) if n not in taken)
    name = f"sleeve-e2e-{secrets.token_hex(3)}"
    base = Path(tempfile.mkdtemp(prefix="sleeve-e2e-user-"))
    base.chmod(0o755)
    home = base / "home"
    subprocess.run(
        ["useradd", "--uid", str(uid), "--user-group", "--create-home", "--home-dir", str(home),
         "--shell", "/bin/sh", name],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield HostUser(name, uid, pwd.getpwnam(name).pw_gid, home)
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
