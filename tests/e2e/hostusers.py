"""Real host accounts for the end-to-end tests (made for a test, removed after it), and the real
`sleeve` command run as one of them against a private Docker engine."""

from __future__ import annotations

import os
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from tests.e2e import dockerenv
from tests.e2e.anthropic_stub import TEST_API_KEY, AnthropicStub

LAUNCHER = "from sidecar.launcher.cli import main; raise SystemExit(main())"


@dataclass
class HostUser:
    """A real host account, made for the test and removed after it."""

    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class UserLauncher:
    """The real `sleeve` command, run as `user` (its own process, uid, groups and HOME)."""

    engine: dockerenv.Engine
    user: HostUser
    project: Path
    env: dict[str, str]
    docker_gid: int

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["/usr/bin/python3", "-c", LAUNCHER, *args],
            env=self.env,
            cwd=self.project,
            user=self.user.uid,
            group=self.user.gid,
            extra_groups=[self.docker_gid],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def launcher_for(engine: dockerenv.Engine, user: HostUser, stub: AnthropicStub) -> UserLauncher:
    project = user.home / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    for path in [project, *project.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    # The system's python3 runs the launcher (the venv's interpreter may live in root's home);
    # the launcher's few dependencies come from the venv's site-packages, the code from the repo.
    site = sysconfig.get_paths()["purelib"]
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(user.home),
        "SLEEVE_HOME": str(user.home / ".sleeve"),
        "DOCKER_HOST": engine.host,
        "DOCKER_BUILDKIT": "0",
        "PYTHONPATH": f"{dockerenv.REPO}:{site}",
        "ANTHROPIC_API_KEY": TEST_API_KEY,
        "ANTHROPIC_BASE_URL": stub.url,
    }
    return UserLauncher(engine, user, project, env, engine.sock.stat().st_gid)
