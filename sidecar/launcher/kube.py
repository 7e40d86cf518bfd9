"""The cluster form of a sleeve: a token Secret, a Service and a one-replica StatefulSet.

`sleeve manifest` builds these from the very `RunPlan` that `sleeve run` executes, and
deploy/helm/sleeve renders the same objects from its values; tests/launcher/test_manifest.py
renders both and compares them, so neither is a hand-kept copy of the other. Pure: a plan and
a target in, objects and YAML text out (the command's input checks live in `manifest`).
"""

from __future__ import annotations

import base64
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from sidecar import config
from sidecar.core.contract import RECORD_MAX_MB, runtime_grace
from sidecar.launcher.homes import seeded
from sidecar.launcher.plan import (
    CONTAINER_PORT,
    PASSTHROUGH_PREFIXES,
    SANDBOX_HOME,
    STATE_DIR,
    TOKEN_FILES,
    TOKEN_SETTINGS,
    WORKSPACE,
    RunPlan,
    fixed_env,
)
from sidecar.launcher.secretopts import secrets_yaml
from sidecar.security.tokens import TOKEN_VAR, VIEW_TOKEN_VAR

Obj = dict[str, Any]

# The image's non-root user `sleeve`; the restricted Pod Security Standard runs everything as it.
POD_UID = 1000
POD_GID = 1000
TOKEN_DIR = "/etc/sleeve/tokens"  # noqa: S105 - a path, not a password
# `--secret`: the secrets file (a ConfigMap's key) and where it is mounted.
SECRETS_DIR = "/etc/sleeve/secrets"
SECRETS_KEY = "secrets.yaml"
SEED_DIR = "/etc/sleeve/seed"
DEFAULT_TERMINATION_GRACE = 30
RESOURCES: Obj = {
    "requests": {"cpu": "250m", "memory": "512Mi"},
    "limits": {"cpu": "2", "memory": "2Gi"},
}
WORKSPACE_SIZE = "10Gi"
HOME_SIZE = "2Gi"
RUN_SIZE = "64Mi"  # /run (memory): the tmux socket, ttyd's socket, the pane's exit files
TMP_SIZE = "1Gi"
# The recordings' volume (disk, for the pod's life), outside the CLI's HOME: the CLI must not
# rewrite them (sidecar.config.trusted refuses a record dir in the HOME). Its size: their cap,
# SIDECAR_RECORD_MAX_MB, and room for the one being written.
RECORDINGS_MOUNT = "/var/lib/sleeve"
RECORD_DIR = f"{RECORDINGS_MOUNT}/recordings"
RECORDINGS_ROOM_MB = 64
# A degraded CLI still answers /health with 200: only a sidecar that stops answering fails them.
PROBES: dict[str, Obj] = {
    "startupProbe": {"periodSeconds": 2, "timeoutSeconds": 2, "failureThreshold": 30},
    "livenessProbe": {"periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    "readinessProbe": {"periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 2},
}
# Copies a seeded sign-in file (the CLI package's `homes.sign_in`: an OAuth credentials file)
# into the home volume once; later refreshes rewrite it.
SEEDED = seeded()
_SIGN_IN = PurePosixPath(SANDBOX_HOME) / str(SEEDED.sign_in)
SEED_SCRIPT = f"""\
set -eu
seed={SEED_DIR}/credentials.json
dest={_SIGN_IN}
if [ -f "$seed" ] && [ ! -e "$dest" ]; then
  mkdir -p -m 700 {_SIGN_IN.parent}
  install -m 600 "$seed" "$dest"
  echo "seeded $dest"
fi
"""

# Host variables that never become literals in a manifest: the tokens go into the Secret, a
# host path means nothing in a pod, and the pod runs entirely as POD_UID (no SIDECAR_USER).
NOT_CARRIED = frozenset({*TOKEN_SETTINGS, "SIDECAR_USER"})


class ManifestError(ValueError):
    """Bad input to `sleeve manifest` (a name, the image, a setting): exit 2 with the message."""


@dataclass(frozen=True)
class Tokens:
    token: str
    view_token: str

    @classmethod
    def new(cls) -> Tokens:
        return cls(secrets.token_urlsafe(32), secrets.token_urlsafe(32))


@dataclass(frozen=True)
class Target:
    """Where the sleeve goes in the cluster, and where its tokens come from."""

    name: str
    namespace: str
    tokens: Tokens | None  # None: `token_secret` names a Secret that exists already
    token_secret: str | None = None


def stop_grace(settings: Mapping[str, str]) -> float:
    """SIDECAR_STOP_GRACE as the sidecar reads it; the pod's grace period is made to fit it."""
    try:
        return config.stop_grace(settings)
    except config.ConfigError as exc:
        raise ManifestError(str(exc)) from None


# -- objects ---------------------------------------------------------------------------


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sleeve", "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    return {**selector_labels(name), "app.kubernetes.io/managed-by": "sleeve"}


def _meta(target: Target, name: str) -> Obj:
    return {"name": name, "namespace": target.namespace, "labels": labels(target.name)}


def pod_env(plan: RunPlan, secrets_name: str = "") -> list[Obj]:
    """The container's variables, sorted by name: the plan's own (as `sleeve run` sets them),
    the token files, the host's SLEEVE_*/SIDECAR_* settings minus NOT_CARRIED, and each
    `--secret`'s value from the Secret `secrets_name` (its key: the secret's name)."""
    host = {
        k: v
        for k, v in plan.passthrough.items()
        if k.startswith(PASSTHROUGH_PREFIXES) and k not in NOT_CARRIED
    }
    env = dict(host)
    # The cluster's ttyd listens on a unix socket in the state dir (TTYD_PORT unset).
    fixed = fixed_env(plan, port=CONTAINER_PORT, host="0.0.0.0")  # noqa: S104
    env.update(fixed)
    env["SIDECAR_STOP_GRACE"] = f"{stop_grace(host):g}"
    # Recordings on a volume of their own: the state dir is memory in a pod (as the chart does).
    env["SIDECAR_RECORD_DIR"] = RECORD_DIR
    env.setdefault("SIDECAR_RECORD_MAX_MB", str(RECORD_MAX_MB))
    for var, name in TOKEN_FILES.items():  # the Secret's keys (token_secret), mounted as files
        env[f"{var}_FILE"] = f"{TOKEN_DIR}/{name}"
    if plan.secrets:
        env["SIDECAR_SECRETS_FILE"] = f"{SECRETS_DIR}/{SECRETS_KEY}"
    items: dict[str, Obj] = {k: {"name": k, "value": v} for k, v in env.items()}
    # Each value from the Secret by reference, into the sidecar's own variable (from_env): one
    # uid runs the pod, so a file it can read could not be hidden from the CLI.
    for secret in plan.secrets:
        ref = {"name": secrets_name, "key": secret.name}
        items[secret.from_env] = {"name": secret.from_env, "valueFrom": {"secretKeyRef": ref}}
    return [items[k] for k in sorted(items)]


def termination_grace(grace: float) -> int:
    """At least the default, and always what the stop-grace rule gives the CLI's `grace`."""
    return max(DEFAULT_TERMINATION_GRACE, runtime_grace(grace))


def _security_context() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def _probe(kind: str) -> Obj:
    return {"httpGet": {"path": "/health", "port": "http"}, **PROBES[kind]}


def _containers(plan: RunPlan, target: Target) -> tuple[list[Obj], list[Obj]]:
    secrets_mount = []
    if plan.secrets:
        secrets_mount = [{"name": "secrets-file", "mountPath": SECRETS_DIR, "readOnly": True}]
    seed = {
        "name": "seed-credentials",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", SEED_SCRIPT],
        "securityContext": _security_context(),
        "resources": RESOURCES,
        "volumeMounts": [
            {"name": "home", "mountPath": SANDBOX_HOME},
            {"name": "seed", "mountPath": SEED_DIR, "readOnly": True},
        ],
    }
    sidecar = {
        "name": "sidecar",
        "image": plan.image,
        "imagePullPolicy": "IfNotPresent",
        "workingDir": WORKSPACE,
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "env": pod_env(plan, f"{target.name}-secrets"),
        "envFrom": [{"secretRef": {"name": f"{target.name}-api-keys", "optional": True}}],
        "securityContext": _security_context(),
        "resources": RESOURCES,
        **{kind: _probe(kind) for kind in PROBES},
        "volumeMounts": [
            {"name": "workspace", "mountPath": WORKSPACE},
            {"name": "home", "mountPath": SANDBOX_HOME},
            {"name": "tokens", "mountPath": TOKEN_DIR, "readOnly": True},
            *secrets_mount,
            {"name": "run", "mountPath": str(Path(STATE_DIR).parent)},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the pod's own emptyDir
            {"name": "recordings", "mountPath": RECORDINGS_MOUNT},
        ],
    }
    return [seed], [sidecar]


def _volumes(plan: RunPlan, target: Target) -> list[Obj]:
    token_secret = target.token_secret or f"{target.name}-tokens"
    secrets_file = []
    if plan.secrets:
        config_map = {"name": f"{target.name}-secrets", "defaultMode": 288}
        secrets_file = [{"name": "secrets-file", "configMap": config_map}]
    return [
        # 0440 (288): root-owned, group fsGroup; the sidecar reads its tokens through the group.
        {"name": "tokens", "secret": {"secretName": token_secret, "defaultMode": 288}},
        *secrets_file,
        {
            "name": "seed",
            "secret": {
                "secretName": f"{target.name}-{SEEDED.seed}",
                "optional": True,
                "defaultMode": 288,
                "items": [{"key": _SIGN_IN.name, "path": "credentials.json"}],
            },
        },
        {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": RUN_SIZE}},
        {"name": "tmp", "emptyDir": {"sizeLimit": TMP_SIZE}},
        {"name": "recordings", "emptyDir": {"sizeLimit": recordings_size(plan.passthrough)}},
    ]


def recordings_size(settings: Mapping[str, str]) -> str:
    """The recordings' volume: SIDECAR_RECORD_MAX_MB (as the sidecar reads it) and room."""
    try:
        cap = config.Recording.from_env(settings).max_bytes
    except config.ConfigError as exc:
        raise ManifestError(str(exc)) from None
    return f"{math.ceil(cap / 2**20) + RECORDINGS_ROOM_MB}Mi"


def _claim(name: str, target: Target, size: str) -> Obj:
    return {
        # Only the selector labels: volumeClaimTemplates cannot change once the set exists.
        "metadata": {"name": name, "labels": selector_labels(target.name)},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }


def statefulset(plan: RunPlan, target: Target) -> Obj:
    init, containers = _containers(plan, target)
    pod_spec = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # service variables would leak into the CLI's environment
        "terminationGracePeriodSeconds": termination_grace(stop_grace(plan.passthrough)),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POD_UID,
            "runAsGroup": POD_GID,
            "fsGroup": POD_GID,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": init,
        "containers": containers,
        "volumes": _volumes(plan, target),
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(target, target.name),
        "spec": {
            "replicas": 1,
            "serviceName": target.name,
            "selector": {"matchLabels": selector_labels(target.name)},
            "template": {
                "metadata": {
                    "labels": labels(target.name),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/path": "/metrics",
                        "prometheus.io/port": str(CONTAINER_PORT),
                    },
                },
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [
                _claim("workspace", target, WORKSPACE_SIZE),
                _claim("home", target, HOME_SIZE),
            ],
        },
    }


def service(target: Target) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(target, target.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(target.name),
            "ports": [
                {"name": "http", "port": CONTAINER_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }


def token_secret(target: Target, tokens: Tokens) -> Obj:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    # Its keys are the names of the files the sleeve reads its tokens from (mounted at TOKEN_DIR).
    files = {TOKEN_FILES[TOKEN_VAR]: tokens.token, TOKEN_FILES[VIEW_TOKEN_VAR]: tokens.view_token}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(target, f"{target.name}-tokens"),
        "type": "Opaque",
        "data": {name: b64(value) for name, value in files.items()},
    }


def secrets_config(plan: RunPlan, target: Target) -> Obj:
    """`--secret`'s secrets file: names, variables and hosts, never a value (those come from
    the Secret `<name>-secrets` by reference)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(target, f"{target.name}-secrets"),
        "data": {SECRETS_KEY: secrets_yaml(plan.secrets, None)},
    }


def network_policy(target: Target) -> Obj:
    """The outer layer of the egress allowlist: the pod reaches DNS and TCP 443 and 80, nothing
    else (by port, not by name: the names are the sidecar's proxy's to check). The chart's
    `egress.networkPolicy` values narrow the peers; this is their default."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(target, target.name),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(target.name)},
            "policyTypes": ["Egress"],
            "egress": [
                {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 80}]},
            ],
        },
    }


def objects(plan: RunPlan, target: Target) -> list[Obj]:
    """The NetworkPolicy unless the network is open (first, as Helm applies it: the pod never
    runs without it), Secret (unless an existing one is named), Service, StatefulSet: the order
    to apply."""
    policy = [] if plan.egress is None else [network_policy(target)]
    made = [] if target.tokens is None else [token_secret(target, target.tokens)]
    config = [secrets_config(plan, target)] if plan.secrets else []
    return [*policy, *made, *config, service(target), statefulset(plan, target)]


# Plain scalars that some YAML reader takes for something else than a string: Go's YAML 1.1
# decoder in kubectl reads `12e45678` (a possible slot id) as a float and `on` as a bool.
_AMBIGUOUS = re.compile(r"^[-+.0-9~]|^(?:y|yes|n|no|true|false|on|off|null)$", re.IGNORECASE)


class _Dumper(yaml.SafeDumper):
    """No anchors, and strings that could be read as another type always double-quoted."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value:  # a goal of several lines stays readable
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    style = '"' if _AMBIGUOUS.match(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(objs: list[Obj]) -> str:
    """Multi-document YAML, as `kubectl apply -f -` reads it."""
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
