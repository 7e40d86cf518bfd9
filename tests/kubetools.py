"""Shared by the Kubernetes tests: the real helm and kubectl binaries (`scripts/setup --test`
puts them into the venv's bin), Kubernetes' own JSON schemas in strict mode, and the restricted
Pod Security Standard written out as checks.

No cluster runs on these machines (no kube-apiserver, kubelet or k3s in any registry), so what
is checked here is what can be checked without one: the objects against the API's schemas of the
oldest and newest supported versions, the pod spec against the restricted profile's rules.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.harness import REPO
from tests.tools import missing

CHART = REPO / "deploy" / "helm" / "sleeve"
# The oldest and newest Kubernetes whose schemas kubernetes-validate 1.37.0 ships.
KUBE_VERSIONS = ("1.25.0", "1.37.0")
HELM_VERSION = "v4.1.4"

Obj = dict[str, Any]


def tool(name: str) -> str:
    """`name` on PATH or beside this interpreter (the venv's bin is not on PATH when pytest runs
    as .venv/bin/python); else skip, or fail in CI (tests.tools.missing)."""
    found = shutil.which(name)
    beside = Path(sys.executable).parent / name
    if found is None and os.access(beside, os.X_OK):
        found = str(beside)
    if found is None:
        missing(f"{name} is not installed (scripts/setup --test installs it)")
    return found


def run(
    argv: list[str], *, ok: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    # No cluster: a kubeconfig that names none, so nothing is ever asked of a real one.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    done = subprocess.run(
        argv, capture_output=True, text=True, input=stdin, env=env, timeout=60, check=False
    )
    if ok:
        assert done.returncode == 0, f"{argv[:3]} failed ({done.returncode}):\n{done.stderr}"
    return done


def helm(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    return run([tool("helm"), *args], ok=ok)


def helm_with(values: Obj | None, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm ARGS -f <values as a file>` (a file keeps every type and any text as it is). The
    file is JSON, which YAML reads as it is: PyYAML would write a string such as `12345e67` (a
    slot id) unquoted, and Go's YAML decoder, which helm uses, reads that as a number."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
        json.dump(values or {}, fh)
        fh.flush()
        return helm(*args, "-f", fh.name, ok=ok)


def helm_template(
    values: Obj | None = None, *, release: str = "demo", namespace: str = "default"
) -> list[Obj]:
    """The chart rendered by the real `helm template`, parsed into objects."""
    out = helm_with(values, "template", release, str(CHART), "--namespace", namespace)
    return documents(out.stdout)


def documents(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d]


def validate_strict(objs: Iterable[Obj]) -> None:
    """Every object against the strict JSON schemas (unknown fields are errors) of the oldest
    and the newest supported Kubernetes, with the library `kubernetes-validate --strict` runs."""
    try:
        import kubernetes_validate
    except ImportError:
        missing("kubernetes-validate is not installed (scripts/setup --test installs it)")
    for obj in objs:
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                where = "/".join(str(p) for p in exc.path)
                msg = (
                    f"{obj['kind']}/{obj['metadata']['name']} on {version}: {where}: {exc.message}"
                )
                raise AssertionError(msg) from None


def by_kind(objs: list[Obj]) -> dict[str, Obj]:
    found = {o["kind"]: o for o in objs}
    assert len(found) == len(objs), "one object per kind expected"
    return found


def pod_spec(objs: list[Obj]) -> Obj:
    spec: Obj = by_kind(objs)["StatefulSet"]["spec"]["template"]["spec"]
    return spec


# -- the restricted Pod Security Standard ------------------------------------------------
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline + restricted),
# as the policy reads the fields of a pod spec.

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
}


def restricted_violations(spec: Obj) -> list[str]:
    """What keeps `spec` out of the restricted profile (empty: it passes)."""
    bad: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(f"{key} is set")
    for vol in spec.get("volumes") or []:
        kinds = set(vol) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {vol['name']} is of type {sorted(kinds)}")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl["name"] not in SAFE_SYSCTLS:
            bad.append(f"sysctl {sysctl['name']}")
    if pod_sc.get("runAsUser") == 0:
        bad.append("pod runAsUser is 0")
    if pod_sc.get("runAsNonRoot") is False:
        bad.append("pod runAsNonRoot is false")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        bad.append("pod seccompProfile is Unconfined")
    if (pod_sc.get("seLinuxOptions") or {}).get("user") or (pod_sc.get("seLinuxOptions") or {}).get(
        "role"
    ):
        bad.append("pod seLinuxOptions sets user or role")
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    containers += spec.get("ephemeralContainers") or []
    for c in containers:
        name = c["name"]
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation is not false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds capabilities {caps['add']}")
        if sc.get("runAsUser") == 0:
            bad.append(f"{name}: runAsUser is 0")
        non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"{name}: runAsNonRoot is not true")
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile is {seccomp}")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{name}: procMount {sc['procMount']}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            bad.append(f"{name}: hostPort")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            bad.append(f"{name}: hostProcess")
    return bad
