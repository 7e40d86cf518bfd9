"""The Helm chart in deploy/helm/sleeve, rendered and linted by the real helm binary and checked
against Kubernetes' strict schemas and the restricted Pod Security Standard.

No cluster runs here (see tests/kubetools.py): `lookup` (tokens kept across upgrades) and the
kubelet itself are not exercised. The probes' meaning is checked against a real sidecar below.
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.core.contract import runtime_grace
from sidecar.launcher.egress_lists import default_patterns
from tests.harness import Sidecar, http
from tests.kubetools import (
    CHART,
    HELM_VERSION,
    by_kind,
    helm,
    helm_template,
    helm_with,
    pod_spec,
    restricted_violations,
    validate_strict,
)

# Every optional part switched on or changed, so the strict schemas see each branch.
EVERYTHING: dict[str, Any] = {
    "fullnameOverride": "agent-a",
    "image": {
        "repository": "registry.example:5000/team/sleeve",
        "tag": "1.2",
        "digest": "sha256:" + "ab" * 32,
    },
    "imagePullSecrets": [{"name": "pull"}],
    "sleeve": {
        "name": "agent-a",
        "cli": "shell",
        "goal": "line one\nline: two",
        "repo": "https://git.example/r.git",
    },
    "sidecar": {
        "restart": "on-failure",
        "stopGrace": 12.5,
        "inboxNotify": "off",
        "allowedOrigins": "https://envoy.example:8443",
        "cliConfig": "/etc/sleeve/clis.yaml",
        "record": "off",
        "recordMaxMB": 50,
    },
    "extraEnv": {"SIDECAR_FUTURE": "1", "NO_COLOR": True},
    "egress": {
        "allow": ["api.example.com", "*.corp.example:8443", "127.0.0.1:9000"],
        "networkPolicy": {
            "ports": [443],
            "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
            "dnsTo": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                    },
                    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                }
            ],
        },
    },
    "terminationGracePeriodSeconds": 45,
    "tokens": {"existingSecret": "agent-a-own-tokens"},
    "apiKeys": {"secretName": "team-keys", "optional": False},
    "secrets": [
        {
            "name": "corp-api",
            "env": "CORP_API_KEY",
            "hosts": ["api.example.com", "*.corp.example"],
            "secretKeyRef": {"name": "team-keys", "key": "corp.key"},
        },
        {
            "name": "github",
            "env": "GH_TOKEN",
            "hosts": ["api.example.com"],
            "secretKeyRef": {"name": "gh", "key": "token"},
        },
    ],
    "credentials": {"seed": False},
    "persistence": {
        "storageClassName": "fast",
        "workspace": {"size": "50Gi"},
        "home": {"size": "1Gi"},
    },
    "securityContext": {
        "runAsUser": 2000,
        "runAsGroup": 2000,
        "fsGroup": 2000,
        "readOnlyRootFilesystem": False,
    },
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
    "probes": {"liveness": {"periodSeconds": 20, "timeoutSeconds": 3, "failureThreshold": 5}},
    "service": {"type": "NodePort", "port": 9090},
    "metrics": {"scrapeAnnotations": False},
    "podAnnotations": {"team": "agents"},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "agents", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["agents"]}]}
                ]
            }
        }
    },
}


def test_helm_is_the_pinned_upstream_release() -> None:
    out = helm("version", "--template", "{{ .Version }}").stdout.strip()
    assert out == HELM_VERSION


def test_chart_lints_strict() -> None:
    done = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in done.stdout


def test_chart_lints_strict_with_every_option() -> None:
    helm_with(EVERYTHING, "lint", "--strict", str(CHART))


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_rendered_chart_is_valid_for_the_oldest_and_newest_kubernetes(
    values: dict[str, Any],
) -> None:
    objs = helm_template(values)
    kinds = sorted(o["kind"] for o in objs)
    expected = (
        ["NetworkPolicy", "Secret", "Service", "StatefulSet"]
        if not values
        else [
            "ConfigMap",
            "NetworkPolicy",
            "Service",
            "StatefulSet",
        ]
    )
    assert kinds == expected
    validate_strict(objs)


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_pod_meets_the_restricted_pod_security_standard(values: dict[str, Any]) -> None:
    spec = pod_spec(helm_template(values))
    assert restricted_violations(spec) == []
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    uid = (values.get("securityContext") or {}).get("runAsUser", 1000)
    assert spec["securityContext"]["runAsUser"] == uid
    assert spec["securityContext"]["fsGroup"] == uid


def test_the_pod_security_check_can_fail() -> None:
    """The checker above is not vacuous: each way out of the profile is caught."""
    spec = pod_spec(helm_template())
    breaks: list[Callable[[dict[str, Any]], None]] = [
        lambda s: s["securityContext"].update(runAsUser=0),
        lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
        lambda s: s["containers"][0]["securityContext"]["capabilities"].update(drop=["NET_RAW"]),
        lambda s: s["initContainers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]
        ),
        lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        lambda s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        lambda s: s.update(hostPID=True),
    ]
    for brk in breaks:
        broken = copy.deepcopy(spec)
        brk(broken)
        assert restricted_violations(broken), broken


def test_secrets_reach_the_pod_only_by_reference() -> None:
    objs = by_kind(helm_template())
    container = objs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SIDECAR_TOKEN_FILE"] == "/etc/sleeve/tokens/token"
    assert env["SIDECAR_VIEW_TOKEN_FILE"] == "/etc/sleeve/tokens/view-token"
    assert not {"SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN", "ANTHROPIC_API_KEY"} & set(env)
    assert container["envFrom"] == [
        {"secretRef": {"name": "demo-sleeve-api-keys", "optional": True}}
    ]
    data = objs["Secret"]["data"]
    tokens = {k: base64.b64decode(v).decode() for k, v in data.items()}
    assert set(tokens) == {"token", "view-token"}
    assert all(len(t) >= 32 for t in tokens.values()) and tokens["token"] != tokens["view-token"]
    # and a second render (no cluster to look up) makes new ones: nothing is fixed in the chart
    again = by_kind(helm_template())["Secret"]["data"]
    assert again["token"] != data["token"]


def test_secret_values_come_by_reference_into_the_sidecars_own_variables() -> None:
    """The restricted pod runs one uid: a value in a file it mounts could be read by the CLI,
    so each value comes by secretKeyRef into SLEEVE_SECRET_<NAME> (the sidecar's from_env), and
    the secrets file (a ConfigMap) holds names, variables and hosts only."""
    objs = by_kind(helm_template(EVERYTHING))
    container = pod_spec(list(objs.values()))["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["SLEEVE_SECRET_CORP_API"] == {
        "name": "SLEEVE_SECRET_CORP_API",
        "valueFrom": {"secretKeyRef": {"name": "team-keys", "key": "corp.key"}},
    }
    assert "CORP_API_KEY" not in env and "GH_TOKEN" not in env  # the sidecar sets placeholders
    assert env["SIDECAR_SECRETS_FILE"]["value"] == "/etc/sleeve/secrets/secrets.yaml"
    assert env["GIT_CONFIG_KEY_1"]["value"] == "credential.https://github.com.helper"
    assert '"password=$GH_TOKEN"' in env["GIT_CONFIG_VALUE_1"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "secrets-file"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/etc/sleeve/secrets", True)
    assert objs["ConfigMap"]["metadata"]["name"] == "agent-a-secrets"
    listed = json.loads(objs["ConfigMap"]["data"]["secrets.yaml"])["secrets"]
    assert listed[0] == {
        "name": "corp-api",
        "env": "CORP_API_KEY",
        "from_env": "SLEEVE_SECRET_CORP_API",
        "hosts": ["api.example.com", "*.corp.example"],
    }


def test_secrets_with_an_open_network_fail_to_render() -> None:
    values = {"egress": {"open": True}, "secrets": EVERYTHING["secrets"]}
    done = helm_with(values, "template", "demo", str(CHART), ok=False)
    assert done.returncode != 0
    assert "secrets need the egress allowlist" in done.stderr


def test_writable_paths_with_a_read_only_root() -> None:
    spec = pod_spec(helm_template())
    container = spec["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/workspace", "/home/sleeve", "/run", "/tmp", "/var/lib/sleeve"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SIDECAR_STATE_DIR"].startswith("/run/") and env["HOME"] == "/home/sleeve"
    # Recordings are on a volume, not in /run's memory (whose size limit is the state dir's),
    # nor in the CLI's HOME (the agent could rewrite them; the sidecar refuses to start).
    assert env["SIDECAR_RECORD_DIR"].startswith("/var/lib/sleeve/")
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["recordings"]["emptyDir"] == {"sizeLimit": "264Mi"}  # 200 MiB and room


# -- bad values --------------------------------------------------------------------------

# values -> a piece of helm's answer that names what is wrong
WRONG_TYPES: dict[str, tuple[dict[str, Any], str]] = {
    "stop grace as text": ({"sidecar": {"stopGrace": "soon"}}, "/sidecar/stopGrace"),
    "grace period as text": (
        {"terminationGracePeriodSeconds": "30"},
        "/terminationGracePeriodSeconds",
    ),
    "root uid": ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
    "uid as text": ({"securityContext": {"runAsUser": "1000"}}, "/securityContext/runAsUser"),
    "unknown pull policy": ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    "image with a space": ({"image": {"repository": "my image"}}, "/image/repository"),
    "unknown restart": ({"sidecar": {"restart": "sometimes"}}, "/sidecar/restart"),
    "recording neither on nor off": ({"sidecar": {"record": "yes"}}, "/sidecar/record"),
    "recordings' cap as text": ({"sidecar": {"recordMaxMB": "200"}}, "/sidecar/recordMaxMB"),
    "token as a literal": ({"extraEnv": {"SIDECAR_TOKEN": "hunter2"}}, "'SIDECAR_TOKEN'"),
    "size as a number": (
        {"persistence": {"workspace": {"size": 10}}},
        "/persistence/workspace/size",
    ),
    "probe period as text": (
        {"probes": {"liveness": {"periodSeconds": "10"}}},
        "/probes/liveness/periodSeconds",
    ),
    "port out of range": ({"service": {"port": 70000}}, "/service/port"),
    "seed as text": ({"credentials": {"seed": "yes"}}, "/credentials/seed"),
    "misspelt key": ({"sleve": {"cli": "shell"}}, "'sleve'"),
    "cli with a space": ({"sleeve": {"cli": "claude code"}}, "/sleeve/cli"),
    "name too long": ({"fullnameOverride": "a" * 53}, "/fullnameOverride"),
    "secret without a reference": (
        {"secrets": [{"name": "a", "env": "A", "hosts": ["a.example"]}]},
        "/secrets/0",
    ),
    "secret host with a scheme": (
        {
            "secrets": [
                {
                    "name": "a",
                    "env": "A",
                    "hosts": ["https://a.example"],
                    "secretKeyRef": {"name": "s", "key": "k"},
                }
            ]
        },
        "/secrets/0/hosts/0",
    ),
    "a secret's carrier in extraEnv": ({"extraEnv": {"SLEEVE_SECRET_A": "x"}}, "SLEEVE_SECRET_A"),
}


@pytest.mark.parametrize(("values", "names"), list(WRONG_TYPES.values()), ids=list(WRONG_TYPES))
def test_values_of_the_wrong_type_fail_lint(values: dict[str, Any], names: str) -> None:
    done = helm_with(values, "lint", "--strict", str(CHART), ok=False)
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "values don't meet the specifications of the schema" in said
    assert names in said, said


@pytest.mark.parametrize(("grace", "period"), [(30, 30), (31, 30), (5, 5), (25.5, 30)])
def test_a_period_shorter_than_the_stop_grace_rule_fails(grace: float, period: int) -> None:
    values = {"sidecar": {"stopGrace": grace}, "terminationGracePeriodSeconds": period}
    done = helm_with(values, "template", "x", str(CHART), ok=False)
    assert done.returncode != 0
    assert "sidecar.stopGrace" in done.stderr
    assert f"terminationGracePeriodSeconds ({period} s) must be at least" in done.stderr


@pytest.mark.parametrize("grace", [0, 0.5, 5, 12.5, 25, 600])
def test_the_chart_checks_the_period_by_the_launchers_stop_grace_rule(grace: float) -> None:
    """The chart's check and `contract.runtime_grace` (docker's --stop-timeout, `sleeve stop`,
    `sleeve manifest`) are one rule: the least period the chart renders is the rule's."""
    least = runtime_grace(grace)
    spec = pod_spec(
        helm_template({"sidecar": {"stopGrace": grace}, "terminationGracePeriodSeconds": least})
    )
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert float(env["SIDECAR_STOP_GRACE"]) == grace
    assert spec["terminationGracePeriodSeconds"] == least
    values = {"sidecar": {"stopGrace": grace}, "terminationGracePeriodSeconds": least - 1}
    assert helm_with(values, "template", "x", str(CHART), ok=False).returncode != 0


def test_install_dry_run_prints_the_notes() -> None:
    done = helm("install", "agent-a", str(CHART), "--dry-run=client", "--namespace", "agents")
    notes = done.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n agents port-forward svc/agent-a-sleeve" in notes
    assert "get secret agent-a-sleeve-tokens" in notes


# -- the probes, against a real sidecar --------------------------------------------------


def kubelet_probe(url: str, timeout: float) -> bool:
    """An httpGet probe as the kubelet runs it: no credentials, success on 200-399."""
    try:
        code, _ = http("GET", url, timeout=timeout)
    except OSError:
        return False
    return 200 <= code < 400


def test_probes_pass_for_a_degraded_cli_and_fail_only_when_the_sidecar_is_gone(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """A sleeve whose CLI is not running (here: an unknown CLI, `fatal`) must stay in the
    Service and must not be restarted by the kubelet: the envoy resleeves it. The probes as
    rendered, run the kubelet's way against a real sidecar with a token set."""
    spec = pod_spec(helm_template())
    container = spec["containers"][0]
    probes = {k: container[k] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    sc = make_sidecar(cli="no-such-cli", env_extra={"SIDECAR_TOKEN": "t" * 32}).start(
        wait_healthy=False
    )
    code, health = sc.get("/health", headers={})
    assert (code, health["status"]) == (200, "degraded")
    for kind, probe in probes.items():
        get = probe["httpGet"]
        assert get["port"] == "http" and container["ports"][0]["containerPort"] == 8080
        assert kubelet_probe(sc.url + get["path"], probe["timeoutSeconds"]), kind
    # The same probe on any other route would fail (it carries no token): only /health fits.
    assert not kubelet_probe(sc.url + "/status", 2)
    assert sc.stop() == 0
    started = time.monotonic()
    assert not kubelet_probe(sc.url + "/health", probes["livenessProbe"]["timeoutSeconds"])
    assert time.monotonic() - started < 5


# ---- egress ----------------------------------------------------------------------------------


def container_env(objs: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod_spec(objs)["containers"][0]["env"]}


def test_egress_defaults_to_the_launchers_list_behind_a_network_policy() -> None:
    objs = helm_template({})
    assert container_env(objs)["SIDECAR_EGRESS_ALLOW"] == ",".join(default_patterns("claude-code"))
    spec = by_kind(objs)["NetworkPolicy"]["spec"]
    assert spec["podSelector"] == {"matchLabels": pod_labels(objs)}
    assert spec["policyTypes"] == ["Egress"]
    assert spec["egress"] == [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 80}]},
    ]


def pod_labels(objs: list[dict[str, Any]]) -> dict[str, str]:
    labels = by_kind(objs)["StatefulSet"]["spec"]["selector"]["matchLabels"]
    return dict(labels)


def test_egress_narrowed_open_and_empty() -> None:
    objs = helm_template(EVERYTHING)
    assert container_env(objs)["SIDECAR_EGRESS_ALLOW"] == (
        "api.example.com,*.corp.example:8443,127.0.0.1:9000"
    )
    dns, tcp = by_kind(objs)["NetworkPolicy"]["spec"]["egress"]
    assert dns["to"] == EVERYTHING["egress"]["networkPolicy"]["dnsTo"]
    assert tcp == {
        "ports": [{"protocol": "TCP", "port": 443}],
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
    }
    opened = helm_template({"egress": {"open": True}})
    assert "NetworkPolicy" not in by_kind(opened)
    assert "SIDECAR_EGRESS_ALLOW" not in container_env(opened)
    nothing = helm_template({"egress": {"allow": []}})
    assert container_env(nothing)["SIDECAR_EGRESS_ALLOW"] == "none"
    no_policy = helm_template({"egress": {"networkPolicy": {"enabled": False}}})
    assert "NetworkPolicy" not in by_kind(no_policy)
    assert "SIDECAR_EGRESS_ALLOW" in container_env(no_policy)


@pytest.mark.parametrize(
    "egress",
    [
        {"allow": ["https://api.example.com"]},
        {"allow": ["api.example.com/v1"]},
        {"networkPolicy": {"ports": [0]}},
        {"networkPolicy": {"ports": []}},
        {"open": "yes"},
    ],
)
def test_bad_egress_values_fail_lint(egress: dict[str, Any]) -> None:
    done = helm_with({"egress": egress}, "lint", "--strict", str(CHART), ok=False)
    assert done.returncode != 0
    assert "/egress/" in done.stdout + done.stderr
