"""The Helm chart's pod, run the way its spec says, in the real Docker engine.

No Kubernetes control plane can run on these machines (no kube-apiserver, kubelet or k3s in any
reachable registry; podman cannot start containers here), so this test is the kubelet: it
renders the chart with `helm template`, reads the StatefulSet's pod spec, and translates it to
`docker run` — the pod's uid and gid, fsGroup as a supplementary group, every capability
dropped, no privilege escalation (no-new-privileges), the read-only root filesystem, Docker's
default seccomp profile for RuntimeDefault, the env, files for the Secrets, host directories
for the PersistentVolumeClaims (group fsGroup, setgid, as the kubelet leaves them), tmpfs for
the emptyDirs, the resource limits — runs the init container first, then the sidecar, and
checks what the cluster would rely on: the probes pass, /metrics answers the token, SIGTERM
ends it with 0 within the grace period, and the workspace and HOME survive a new container
(the StatefulSet's restart).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.loopback import free_port
from tests.e2e import dockerenv
from tests.harness import http, wait_for
from tests.kubetools import helm_template
from tests.tools import missing

pytestmark = [pytest.mark.docker, pytest.mark.slow]

Obj = dict[str, Any]
TOKEN = "kube-e2e-token-0123456789"
VIEW_TOKEN = "kube-e2e-view-0123456789"


def rendered_pod(image: str) -> tuple[Obj, Obj]:
    """The chart's StatefulSet and its pod spec, for a `shell` sleeve of the image under test."""
    repository, _, tag = image.rpartition(":")
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "sleeve": {"cli": "shell", "name": "kube-e2e"},
        "tokens": {"existingSecret": "kube-e2e-tokens"},
    }
    objs = helm_template(values, release="kube-e2e")
    [sts] = [o for o in objs if o["kind"] == "StatefulSet"]
    return sts, sts["spec"]["template"]["spec"]


def _quantity_cpus(value: str) -> str:
    return str(int(value[:-1]) / 1000) if value.endswith("m") else value


def _quantity_bytes(value: str) -> str:
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    return value[:-2] + units[value[-2:]] if value[-2:] in units else value


class Kubelet:
    """Just enough of a kubelet: volumes on the host, containers as `docker run`."""

    def __init__(self, engine: dockerenv.Engine, root: Path, sts: Obj, pod: Obj) -> None:
        self.engine = engine
        self.root = root
        self.pod = pod
        self.port = free_port()
        self.security = pod["securityContext"]
        self.group = int(self.security["fsGroup"])
        self.volumes: dict[str, Path | None] = {}  # name -> host dir (None: tmpfs)
        for claim in sts["spec"]["volumeClaimTemplates"]:
            self.volumes[claim["metadata"]["name"]] = self._claim(claim["metadata"]["name"])
        for volume in pod["volumes"]:
            self.volumes[volume["name"]] = self._volume(volume)

    def _dir(self, name: str, mode: int) -> Path:
        path = self.root / name
        path.mkdir(exist_ok=True)
        os.chown(path, 0, self.group)
        path.chmod(mode)
        return path

    def _claim(self, name: str) -> Path:
        # A fresh volume, as the kubelet leaves it for fsGroup: group fsGroup, group-writable,
        # setgid so that what the pod makes in it stays in the group.
        return self._dir(f"pvc-{name}", 0o2775)

    def _volume(self, volume: Obj) -> Path | None:
        if "emptyDir" in volume:
            return None  # a tmpfs per container
        if "secret" in volume:
            secret = volume["secret"]
            path = self._dir(f"secret-{volume['name']}", 0o755)
            files = {
                "kube-e2e-tokens": {"token": TOKEN, "view-token": VIEW_TOKEN},
            }.get(secret["secretName"])
            if files is None:
                assert secret.get("optional"), f"secret {secret['secretName']} is not optional"
                return path  # an optional Secret that does not exist: an empty directory
            for key, text in files.items():
                (path / key).write_text(text + "\n")  # a Secret made from a file ends with one
                os.chown(path / key, 0, self.group)
                (path / key).chmod(int(secret.get("defaultMode", 0o644)))
            return path
        msg = f"volume kind not translated: {volume}"
        raise AssertionError(msg)

    def docker_run(self, container: Obj, name: str, *, detach: bool) -> list[str]:
        sc = {**self.security, **container.get("securityContext", {})}
        argv = ["run", "--name", name, "--network", "host", "--pull", "never"]
        argv += ["--user", f"{sc['runAsUser']}:{sc['runAsGroup']}", "--group-add", str(self.group)]
        assert sc["runAsNonRoot"] is True and int(sc["runAsUser"]) != 0
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
        argv += ["--cap-drop", "ALL"]
        assert sc["allowPrivilegeEscalation"] is False
        argv += ["--security-opt", "no-new-privileges"]
        # RuntimeDefault: the engine's default seccomp profile (checked on in `seccomp_on`).
        assert sc["seccompProfile"]["type"] == "RuntimeDefault"
        if sc.get("readOnlyRootFilesystem"):
            argv.append("--read-only")
        limits = container.get("resources", {}).get("limits", {})
        if "cpu" in limits:
            argv += ["--cpus", _quantity_cpus(limits["cpu"])]
        if "memory" in limits:
            argv += ["--memory", _quantity_bytes(limits["memory"])]
        if "workingDir" in container:
            argv += ["--workdir", container["workingDir"]]
        for env in container.get("env", []):
            value = env["value"]
            # Host network (tests reach loopback only): a free loopback port, not the pod's own.
            if env["name"] == "SIDECAR_PORT":
                value = str(self.port)
            if env["name"] == "SIDECAR_HOST":
                value = "127.0.0.1"
            argv += ["--env", f"{env['name']}={value}"]
        for mount in container.get("volumeMounts", []):
            host = self.volumes[mount["name"]]
            if host is None:
                argv += ["--tmpfs", f"{mount['mountPath']}:rw,exec,mode=1777"]
            else:
                ro = ",readonly" if mount.get("readOnly") else ""
                argv += ["--mount", f"type=bind,src={host},dst={mount['mountPath']}{ro}"]
        argv.append("--detach" if detach else "--rm")
        # A container's `command` replaces the image's ENTRYPOINT, its `args` the CMD.
        command = container.get("command", [])
        if command:
            argv += ["--entrypoint", command[0]]
        return [*argv, container["image"], *command[1:], *container.get("args", [])]

    def start(self, name: str) -> None:
        for init in self.pod.get("initContainers", []):
            done = self.engine.docker(
                *self.docker_run(init, f"{name}-{init['name']}", detach=False), check=False
            )
            assert done.returncode == 0, f"init container {init['name']}: {done.stderr}"
        [container] = self.pod["containers"]
        self.engine.docker(*self.docker_run(container, name, detach=True))

    def probe(self, kind: str) -> None:
        """The container's probe, the kubelet's way: GET until it answers 2xx/3xx within its
        failure threshold."""
        [container] = self.pod["containers"]
        spec = container[f"{kind}Probe"]
        get = spec["httpGet"]
        deadline = spec["failureThreshold"] * spec["periodSeconds"]

        def ok() -> bool:
            try:
                code, _ = http(
                    "GET",
                    f"http://127.0.0.1:{self.port}{get['path']}",
                    timeout=spec["timeoutSeconds"],
                )
            except OSError:
                return False
            return 200 <= code < 400

        wait_for(ok, deadline, what=f"{kind} probe")


def _get(port: int, path: str, token: str | None) -> tuple[int, Any]:
    return http("GET", f"http://127.0.0.1:{port}{path}", timeout=5, token=token)


def test_the_charts_restricted_pod_runs_in_a_real_engine(
    engine: dockerenv.Engine, image: str, tmp_path: Path
) -> None:
    info = json.loads(engine.docker("info", "--format", "{{json .SecurityOptions}}").stdout)
    if not any("seccomp" in opt for opt in info):
        missing("the Docker engine has no seccomp support (RuntimeDefault cannot be shown)")
    tmp_path.chmod(0o755)  # the pod's uid must reach the volumes below
    sts, pod = rendered_pod(image)
    kubelet = Kubelet(engine, tmp_path, sts, pod)
    grace = int(pod["terminationGracePeriodSeconds"])

    kubelet.start("kube-e2e-0")
    kubelet.probe("startup")
    kubelet.probe("readiness")
    kubelet.probe("liveness")
    port = kubelet.port
    assert _get(port, "/status", None)[0] == 401

    def healthy() -> Any:
        code, body = _get(port, "/status", TOKEN)
        assert code == 200, body
        return body if body["health"] == "healthy" else None

    wait_for(healthy, 10, what="the CLI running")
    code, body = _get(port, "/metrics", VIEW_TOKEN)
    assert code == 200 and b"sidecar_cli_up 1" in body
    # Everything in the container runs as the pod's uid.
    ps = engine.docker("top", "kube-e2e-0", "-o", "pid,uid,comm").stdout.splitlines()[1:]
    uid = str(pod["securityContext"]["runAsUser"])
    assert ps and all(line.split()[1] == uid for line in ps), ps

    # State the StatefulSet's volumes must keep: a message (workspace) and a file in HOME.
    req_body = {"from": "envoy", "type": "task", "content": "survive a restart"}
    code, _ = http("POST", f"http://127.0.0.1:{port}/inbox", req_body, timeout=5, token=TOKEN)
    assert code == 201
    engine.docker("exec", "kube-e2e-0", "sh", "-c", "echo kept > $HOME/marker")

    # SIGTERM (what the kubelet sends), exit 0 well within the grace period.
    started = time.monotonic()
    engine.docker("stop", "--time", str(grace), "kube-e2e-0")
    took = time.monotonic() - started
    state = json.loads(engine.docker("inspect", "--format", "{{json .State}}", "kube-e2e-0").stdout)
    assert state["ExitCode"] == 0, state
    assert took < grace, took
    engine.docker("rm", "kube-e2e-0")

    # What the pod wrote belongs to its uid (group fsGroup), never to root.
    workspace = kubelet.volumes["workspace"]
    assert workspace is not None
    for path in [workspace / ".needlecast", workspace / ".needlecast" / "inbox.md"]:
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (1000, kubelet.group), (path, st.st_uid, st.st_gid)
        assert not stat.S_ISLNK(st.st_mode)

    # The StatefulSet's restart: a new container on the same volumes.
    kubelet.start("kube-e2e-0")
    kubelet.probe("startup")
    code, body = _get(port, "/inbox", TOKEN)
    assert code == 200
    assert [m["content"] for m in body["messages"]] == ["survive a restart"]
    home = engine.docker("exec", "kube-e2e-0", "cat", "/home/sleeve/marker").stdout
    assert home.strip() == "kept"
    engine.docker("stop", "--time", str(grace), "kube-e2e-0")
    engine.docker("rm", "kube-e2e-0")
