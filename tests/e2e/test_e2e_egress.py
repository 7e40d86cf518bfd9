"""Egress in the image, in the real Docker engine: the sidecar as root with SIDECAR_USER (what
`sleeve run` does) and the restricted pod's settings (uid 1000, no capability, no privilege
escalation, a read-only root). In both, a probe CLI reaches a listed host on loopback through
the proxy and is refused everything around it; the guard needs no privilege for that."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.loopback import free_port
from tests.e2e import dockerenv
from tests.e2e.conftest import POD, keep_logs, probe_run
from tests.harness import wait_for
from tests.webserver import web_server

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

PROBE = Path(__file__).parent.parent / "clis" / "egress_probe.py"


@pytest.mark.parametrize(
    "where",
    [
        pytest.param(["--env", "SIDECAR_USER=1000:1000"], id="root-with-sidecar-user"),
        pytest.param(POD, id="restricted-pod"),
    ],
)
def test_the_cli_reaches_listed_hosts_through_the_proxy_and_nothing_else(
    engine: dockerenv.Engine, image: str, tmp_path: Path, where: list[str]
) -> None:
    name, port = f"e2e-egress-{len(where)}", free_port()
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "probe.py").write_text(PROBE.read_text())
    volume = f"{name}-ws"
    with web_server() as web:
        urls = [f"http://127.0.0.1:{web}/", "http://127.0.0.1:1/"]
        command = ["python3", "/opt/tools/probe.py", "/workspace/report.json", *urls]
        (tools / "clis.yaml").write_text(json.dumps({"clis": {"probe": {"command": command}}}))
        tmp_path.chmod(0o755)
        engine.docker(*probe_run(name, port, tools, f"127.0.0.1:{web}", *where), image)
        try:

            def report() -> dict[str, Any] | None:
                state = engine.docker("inspect", "--format", "{{.State.Status}}", name).stdout
                assert state.strip() == "running", keep_logs(engine, name)
                got = engine.docker("exec", name, "cat", "/workspace/report.json", check=False)
                return json.loads(got.stdout) if got.returncode == 0 and got.stdout else None

            got = wait_for(report, 60, what="the probe's report")
            assert got["results"][0] == [200, "hello"], got
            assert got["results"][1][0] == 403, got
            assert got["direct"] == {"tcp": "EACCES", "udp": "EACCES", "ipv6": "EAFNOSUPPORT"}
        finally:
            keep_logs(engine, name)
            engine.docker("rm", "-f", name, check=False)
            engine.docker("volume", "rm", volume, check=False)
