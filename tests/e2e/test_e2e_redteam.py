"""The red team in the image, run the way the Helm chart's pod runs it (issue 29): one uid
(1000) for the sidecar and the CLI, no capability, no privilege escalation, a read-only root,
/run and /tmp tmpfs, the egress allowlist in force, a secret set (so the egress CA exists) and
the API token a 0400 file. The CLI is tests/redteam/pod_probe.py: every attack it makes on the
sidecar's side is refused, while it writes its workspace and reaches an allowed stub."""

from __future__ import annotations

import errno
import json
import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.layout import Layout
from sidecar.core.loopback import free_port
from tests.agenttools import EventLog
from tests.e2e import dockerenv
from tests.e2e.conftest import POD, cli_up, keep_logs, probe_run
from tests.harness import wait_for
from tests.webserver import web_server

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

TESTS = Path(__file__).resolve().parents[1]
TOOLS = [TESTS / "redteam" / n for n in ("pod_probe.py", "attacks.py")]
TOOLS += [TESTS / "clis" / n for n in ("egress_probe.py", "secrets_probe.py")]
STATE = Layout(Path("/run/sidecar"))
CREDS = Path("/run/secrets/sleeve")
CREDENTIALS = (CREDS / "token", CREDS / "secrets.yaml")
# Made the first time Web Push is used: absent here (the fence would refuse them too).
UNUSED = {STATE.vapid_key, STATE.push_devices}
SOCKETS = {"tmux": STATE.tmux_socket, "ttyd": STATE.ttyd_socket, "report": STATE.egress_reports}


def _pod_files(tmp_path: Path, token: str, web: int) -> tuple[Path, Path]:
    """The probe and its registry (root's, read-only in the pod: the sidecar refuses a registry
    the agent could write), and the credentials (the pod's Secret: 1000's, 0400)."""
    tools, creds = tmp_path / "tools", tmp_path / "creds"
    tools.mkdir()
    for tool in TOOLS:
        (tools / tool.name).write_text(tool.read_text())
    spec = {
        "report": "/workspace/redteam.json",
        "go": "/workspace/go",
        "workspace": "/workspace",
        "sockets": {name: str(path) for name, path in SOCKETS.items()},
        "read": [str(p) for p in (*STATE.private_files, *CREDENTIALS)],
        "write": [str(p) for p in (STATE.cli_env, STATE.hook_settings("probe"))]
        + [str(STATE.placeholders), str(STATE.tmux_conf)],
        "urls": [f"http://127.0.0.1:{web}/", "http://127.0.0.1:1/"],
    }
    (tools / "spec.json").write_text(json.dumps(spec))
    command = ["python3", "/opt/tools/pod_probe.py", "/opt/tools/spec.json"]
    (tools / "clis.yaml").write_text(json.dumps({"clis": {"probe": {"command": command}}}))
    secret = {
        "name": "api",
        "env": "API_KEY",
        "from_env": "SLEEVE_SECRET_API",
        "hosts": ["127.0.0.1"],
    }
    creds.mkdir()
    (creds / "token").write_text(token + "\n")
    (creds / "secrets.yaml").write_text(json.dumps({"secrets": [secret]}))
    for path in (creds, *creds.iterdir()):
        os.chown(path, 1000, 1000)
        path.chmod(0o500 if path.is_dir() else 0o400)
    tmp_path.chmod(0o755)
    return tools, creds


def test_the_guarded_cli_of_a_one_uid_pod_is_refused_every_way_at_the_sidecar(
    engine: dockerenv.Engine, image: str, tmp_path: Path, artifacts: Path
) -> None:
    name, port, token = "e2e-redteam", free_port(), "t-" + secrets.token_hex(16)
    volume = f"{name}-ws"
    with web_server() as web:
        tools, creds = _pod_files(tmp_path, token, web)
        pod = [*POD, "--mount", f"type=bind,source={creds},target={CREDS},readonly"]
        pod += ["--env", f"SIDECAR_TOKEN_FILE={CREDENTIALS[0]}"]
        pod += ["--env", f"SIDECAR_SECRETS_FILE={CREDENTIALS[1]}"]
        pod += ["--env", "SLEEVE_SECRET_API=sk-" + secrets.token_hex(16)]
        engine.docker(*probe_run(name, port, tools, f"127.0.0.1:{web}", *pod), image)
        try:
            wait_for(
                lambda: _running(engine, name) and cli_up(port, token, "probe"),
                60,
                what="the probe running as the CLI",
            )
            events = EventLog(f"http://127.0.0.1:{port}", token)
            engine.docker("exec", name, "touch", "/workspace/go")
            got = wait_for(lambda: _report(engine, name), 120, what="the probe's report")
            (artifacts / "redteam-pod.json").write_text(json.dumps(got, indent=2))
            _assert_refused(got)
            # The same uid outside the guard reads the token and reaches tmux: the refusals
            # are the guard's, not the files' modes or a dead socket's.
            assert engine.docker("exec", name, "cat", str(CREDENTIALS[0])).stdout.strip() == token
            tmux = ["tmux", "-S", str(SOCKETS["tmux"]), "list-sessions", "-F", "#S"]
            assert engine.docker("exec", name, *tmux).stdout.split() == ["main"]
            # The broker's (and the proxy's) real refusals, once per host and way; nothing
            # forged, no other.
            expected = {(str(SOCKETS[s]), 0, "unix") for s in ("tmux", "ttyd")}
            expected |= {(f"/workspace/{s}.symlink", 0, "unix") for s in ("tmux", "ttyd")}
            expected |= {("127.0.0.1", 1, "proxy"), ("127.0.0.1", web, "direct")}
            expected |= {("", 0, "udp"), ("", 0, "ipv6")}
            wait_for(lambda: expected <= _told(events), 20, what=f"the refusals {expected}")
            assert _told(events) == expected
        finally:
            keep_logs(engine, name)
            engine.docker("rm", "-f", name, check=False)
            engine.docker("volume", "rm", volume, check=False)


def _told(events: EventLog) -> set[tuple[str, int, str]]:
    return {(e["host"], e["port"], e["how"]) for e in events.of("egress-denied")}


def _running(engine: dockerenv.Engine, name: str) -> bool:
    state = engine.docker("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
    assert state == "running", keep_logs(engine, name)
    return True


def _report(engine: dockerenv.Engine, name: str) -> dict[str, Any] | None:
    _running(engine, name)
    got = engine.docker("exec", name, "cat", "/workspace/redteam.json", check=False)
    return json.loads(got.stdout) if got.returncode == 0 and got.stdout else None


def _assert_refused(got: dict[str, Any]) -> None:
    """Each attack's refusal, by its errno or status; the allowed things done."""
    # Not a broken setup: the workspace is written, the allowed stub reached through the proxy.
    assert got["workspace"] == "ok"
    assert got["egress"]["results"][0] == [200, "hello"], got["egress"]
    # The proxy refuses a host off the list; the guard a direct connection, UDP and IPv6.
    assert got["egress"]["results"][1][0] == 403, got["egress"]
    assert got["egress"]["direct"] == {"tcp": "EACCES", "udp": "EACCES", "ipv6": "EAFNOSUPPORT"}
    # The sockets: not renamed nor linked (the state dir is fenced), reached by no path, and
    # tmux's command runs in no server; a stream connect to the report socket (a datagram
    # one) fails as it would anywhere, a datagram is refused before it has an address.
    for sock in SOCKETS:
        assert (got[f"{sock}:rename"], got[f"{sock}:link"], got[f"{sock}:symlink"]) == (
            "EACCES", "EACCES", "ok",
        ), sock  # fmt: skip
    refused = {"tmux": "EACCES", "ttyd": "EACCES", "report": "EPROTOTYPE"}
    assert got["connect"] == {
        f"{s}{how}": e for s, e in refused.items() for how in ("", ":symlink")
    }
    for path, tried in got["run_shell"].items():
        error = os.strerror(getattr(errno, refused[path.partition(":")[0]]))
        assert tried["code"] == 1 and f"({error})" in tried["stderr"], (path, tried)
        assert not tried["escaped"]
    assert got["forge"] == "EACCES"
    # attacks.py: the socket kinds the broker never sees, IP options, the resolver's files
    # (root's in the image: 1000 could not change them unguarded either), no capability.
    assert got["attacks"] == {
        "unix_raw": "EACCES", "unix_dgram": "EACCES", "pair_dgram": "EACCES", "pair_stream": "ok",
        "ip_options": "EPERM", "bind_to_device": "EPERM",
        "/etc/hosts": "EACCES", "/etc/resolv.conf": "EACCES", "/etc/nsswitch.conf": "EACCES",
        "status": {"CapEff": "0" * 16, "CapBnd": "0" * 16, "CapAmb": "0" * 16, "NoNewPrivs": "1"},
    }  # fmt: skip
    # The state dir's private files (the CA's key and certificates among them) and the pod's
    # credential files: read by the same uid outside the guard, by none inside.
    read = got["read"]
    assert str(STATE.egress_ca / "ca.key") in read
    files = {str(p) for p in (*STATE.private_files, *CREDENTIALS) if p != STATE.egress_ca}
    assert files <= set(read)
    for path, error in read.items():
        assert error == ("ENOENT" if Path(path) in UNUSED else "EACCES"), (path, error)
    assert set(got["write"].values()) == {"EACCES"}, got["write"]
    # ptrace, process_vm_readv, /proc/PID/mem and environ of every process outside the probe.
    processes = got["processes"].values()
    argvs = " ".join(p["argv"] for p in processes)
    assert argvs.count("bin/sidecar") >= 2 and "ttyd" in argvs and "tmux" in argvs, argvs
    assert "runpy" in argvs  # the guard's broker
    for proc in processes:
        assert (proc["ptrace"], proc["process_vm_readv"]) == ("EPERM", "EPERM"), proc
        assert (proc["environ"], proc["mem"]) == ("EACCES", "EACCES"), proc
