"""`sleeve run --secret` on a real (private) Docker engine, by a non-root host user: the value
is in nothing the engine shows (`docker inspect`: the container's variables, command, mounts),
in no file of the launcher's, and inside the container only in a root-only file that the CLI's
user cannot open."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.core.loopback import free_port
from tests.e2e import dockerenv
from tests.e2e.anthropic_stub import AnthropicStub
from tests.e2e.conftest import health_ok, keep_logs
from tests.e2e.hostusers import HostUser, launcher_for
from tests.harness import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

VALUE = "sk-ant-api03-E2E-REAL-SECRET-0123456789abcdef"


def test_a_secret_reaches_only_a_root_file_in_the_container_and_nothing_docker_shows(
    engine: dockerenv.Engine,
    image: str,
    stub: AnthropicStub,
    host_user: HostUser,
) -> None:
    lch = launcher_for(engine, host_user, stub)
    key = host_user.home / "anthropic-key"
    key.write_text(VALUE + "\n")
    key.chmod(0o600)
    os.chown(key, host_user.uid, host_user.gid)
    port = free_port()
    run = lch(
        "run", "--runtime", "docker", "--network", "host", "--image", image, "--port", str(port),
        "--shell", "--secret", f"anthropic={key}", timeout=120,
    )  # fmt: skip
    container = None
    try:
        assert run.returncode == 0, run.stderr
        assert VALUE not in run.stdout + run.stderr
        (record,) = json.loads(lch("ps", "--json").stdout)
        container = record["container"]
        wait_for(lambda: health_ok(port), 30, what="the sleeve's /health")
        # Nothing docker shows holds it: the variables, the command, the mounts, the labels.
        inspect = engine.docker("inspect", container).stdout
        assert VALUE not in inspect
        config = json.loads(inspect)[0]
        env = dict(item.split("=", 1) for item in config["Config"]["Env"])
        assert env["SIDECAR_SECRETS_FILE"] == "/run/sleeve/secrets.yaml"
        assert "ANTHROPIC_API_KEY" not in env, "the host's own key is not passed by name"
        assert not any("secret" in m.get("Destination", "") for m in config["Mounts"])
        # Inside: a root-only file, named by the secrets file; the CLI's user cannot open it.
        listed = engine.docker("exec", container, "cat", "/run/sleeve/secrets.yaml").stdout
        assert json.loads(listed)["secrets"] == [
            {
                "env": "ANTHROPIC_API_KEY",
                "file": "/run/sleeve/secrets/anthropic",
                "hosts": ["api.anthropic.com"],
                "name": "anthropic",
            }
        ]
        path = "/run/sleeve/secrets/anthropic"
        assert engine.docker("exec", container, "stat", "-c", "%a %u", path).stdout.split() == [
            "600",
            "0",
        ]
        assert engine.docker("exec", container, "cat", path).stdout == VALUE
        as_user = f"{host_user.uid}:{host_user.gid}"
        denied = engine.docker("exec", "--user", as_user, container, "cat", path, check=False)
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        # The launcher keeps nothing of it.
        for found in Path(lch.env["SLEEVE_HOME"]).rglob("*"):
            if found.is_file():
                assert VALUE.encode() not in found.read_bytes(), found
    finally:
        if container is not None:
            keep_logs(engine, container)
            engine.docker("rm", "-f", container, check=False)
