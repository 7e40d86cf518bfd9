"""`sleeve manifest`: the cluster form of `sleeve run`, built from the same RunPlan, equal to what
the Helm chart renders for the same settings, valid for the oldest and newest Kubernetes, and
refusing bad input with exit 2. (No cluster runs here: see tests/kubetools.py.)"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shlex
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubetools import (
    by_kind,
    documents,
    helm,
    helm_template,
    pod_spec,
    restricted_violations,
    run,
    tool,
    validate_strict,
)

from .helpers import REPO, Result

Obj = dict[str, Any]
# Labels only one side can carry: Helm's own, and who manages the objects.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/version")
# Host settings and the chart values they become (anything else SLEEVE_/SIDECAR_: extraEnv).
SETTING_VALUES = {
    "SLEEVE_REPO": ("sleeve", "repo"),
    "SIDECAR_RESTART": ("sidecar", "restart"),
    "SIDECAR_INBOX_NOTIFY": ("sidecar", "inboxNotify"),
    "SIDECAR_ALLOWED_ORIGINS": ("sidecar", "allowedOrigins"),
    "SIDECAR_CLI_CONFIG": ("sidecar", "cliConfig"),
    "SIDECAR_RECORD": ("sidecar", "record"),
}
HOST_SECRETS = {
    "ANTHROPIC_API_KEY": "sk-ant-api03-HOSTKEY-never-in-a-manifest",
    "OPENAI_API_KEY": "sk-openai-HOSTKEY-never-in-a-manifest",
    "SIDECAR_TOKEN": "host-admin-token-never-in-a-manifest",
    "SIDECAR_VIEW_TOKEN": "host-view-token-never-in-a-manifest",
}


@pytest.fixture
def slot_id(project: Path, sleeve: Callable[..., Result]) -> str:
    res = sleeve("create", "--project", project, "--json")
    assert res.code == 0, res.err
    return str(json.loads(res.out)["id"])


def manifest(sleeve: Callable[..., Result], *args: str | Path, **env: str) -> list[Obj]:
    res = sleeve("manifest", *args, extra_env=env)
    assert res.code == 0, res.err
    return documents(res.out)


def normalised(objs: list[Obj], managed_by: str) -> dict[tuple[str, str], Obj]:
    """Objects keyed by kind and name, with what must differ taken out: Helm's labels, the
    managed-by label (checked to be `managed_by`), and the random token values (checked to be
    tokens)."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if "labels" in out and isinstance(out["labels"], dict):
                labels = {k: v for k, v in out["labels"].items() if k not in HELM_ONLY_LABELS}
                if "app.kubernetes.io/managed-by" in labels:
                    assert labels.pop("app.kubernetes.io/managed-by") == managed_by
                out["labels"] = labels
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    keyed = {}
    for obj in objs:
        obj = walk(obj)
        if obj["kind"] == "Secret":
            for key, value in obj["data"].items():
                assert len(base64.b64decode(value)) >= 32
                obj["data"][key] = "<random token>"
        keyed[(obj["kind"], obj["metadata"]["name"])] = obj
    return keyed


def chart_values(
    slot_id: str, name: str, objs: list[Obj], host: dict[str, str], flags: dict[str, str]
) -> Obj:
    """The chart values that `sleeve manifest` with these flags and host settings implies."""
    repo, _, tag = flags.get("image", "sleeve:latest").rpartition(":")
    values: Obj = {
        "fullnameOverride": name,
        "image": {"repository": repo, "tag": tag},
        "sleeve": {"name": slot_id, "cli": flags.get("cli", "claude-code")},
        "sidecar": {"stopGrace": float(host.get("SIDECAR_STOP_GRACE", 5))},
        "extraEnv": {},
        # what the manifest chose for the grace is checked by its own test below
        "terminationGracePeriodSeconds": pod_spec(objs)["terminationGracePeriodSeconds"],
    }
    if "goal" in flags:
        values["sleeve"]["goal"] = flags["goal"]
    env = {e["name"]: e.get("value") for e in pod_spec(objs)["containers"][0]["env"]}
    if "SIDECAR_EGRESS_ALLOW" in env:  # the default list of the manifest's CLI
        values["egress"] = {"allow": env["SIDECAR_EGRESS_ALLOW"].split(",")}
    if "token_secret" in flags:
        values["tokens"] = {"existingSecret": flags["token_secret"]}
    for var, value in host.items():
        if var in SETTING_VALUES:
            group, key = SETTING_VALUES[var]
            values[group][key] = value
        elif var.startswith(("SLEEVE_", "SIDECAR_")) and var not in (
            "SIDECAR_STOP_GRACE",
            "SIDECAR_TOKEN",
            "SIDECAR_VIEW_TOKEN",
            "SIDECAR_USER",
        ):
            values["extraEnv"][var] = value
    return values


CASES: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    # flags, host environment
    "defaults": ({}, {}),
    "everything": (
        {
            "cli": "shell",
            "goal": "Fix the login bug.\nThen: write `tests` & $(nothing) runs",
            "image": "registry.example:5000/team/sleeve:1.2",
            "name": "agent-a",
            "namespace": "agents",
        },
        {
            "SIDECAR_RESTART": "on-failure",
            "SIDECAR_STOP_GRACE": "40",
            "SIDECAR_INBOX_NOTIFY": "off",
            "SIDECAR_ALLOWED_ORIGINS": "https://envoy.example:8443",
            "SIDECAR_CLI_CONFIG": "/etc/sleeve/clis.yaml",
            "SLEEVE_REPO": "https://git.example/team/app.git",
            "SIDECAR_FUTURE_KNOB": "on",
            "SIDECAR_USER": "1000:1000",
            **HOST_SECRETS,
        },
    ),
    "own token secret": ({"token_secret": "agent-b-tokens", "name": "agent-b"}, {}),
}


@pytest.mark.parametrize(("flags", "host"), list(CASES.values()), ids=list(CASES))
def test_manifest_equals_the_chart_rendered_with_the_same_settings(
    flags: dict[str, str],
    host: dict[str, str],
    project: Path,
    slot_id: str,
    sleeve: Callable[..., Result],
) -> None:
    args = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    objs = manifest(sleeve, "--project", project, "--slot", "1", *args, **host)
    name = flags.get("name", f"sleeve-my-project-{slot_id}")
    values = chart_values(slot_id, name, objs, host, flags)
    chart = helm_template(values, release=name, namespace=flags.get("namespace", "default"))
    ours, theirs = normalised(objs, "sleeve"), normalised(chart, "Helm")
    assert sorted(ours) == sorted(theirs)
    for key, obj in ours.items():
        assert obj == theirs[key], f"{key} differs from the chart's"


def test_manifest_with_secrets_equals_the_chart_and_renders_no_value(
    tmp_path: Path, project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    """`--secret NAME=FILE`: the values come from the Secret <name>-secrets by reference (the
    hint says how to make it from the files); the output holds no value, and the chart with
    the same `secrets` values renders the same objects."""
    value = "sk-ant-api03-MANIFEST-VALUE-0123456789"
    key = tmp_path / "key file"
    key.write_text(value + "\n")
    args = ["--project", project, "--slot", "1", "--secret", f"anthropic={key}"]
    res = sleeve("manifest", *args, "--secret", f"github={key}")
    assert res.code == 0, res.err
    assert value not in res.out and value not in res.err
    name = f"sleeve-my-project-{slot_id}"
    quoted = shlex.quote(str(key))
    assert (
        f"kubectl -n default create secret generic {name}-secrets "
        f"--from-file=anthropic={quoted} --from-file=github={quoted}"
    ) in res.err
    objs = documents(res.out)
    validate_strict(objs)
    assert restricted_violations(pod_spec(objs)) == []
    values = chart_values(slot_id, name, objs, {}, {})
    ref = f"{name}-secrets"
    values["secrets"] = [
        {
            "name": "anthropic",
            "env": "ANTHROPIC_API_KEY",
            "hosts": ["api.anthropic.com"],
            "secretKeyRef": {"name": ref, "key": "anthropic"},
        },
        {
            "name": "github",
            "env": "GH_TOKEN",
            "hosts": ["github.com", "api.github.com"],
            "secretKeyRef": {"name": ref, "key": "github"},
        },
    ]
    ours = normalised(objs, "sleeve")
    theirs = normalised(helm_template(values, release=name), "Helm")
    assert sorted(ours) == sorted(theirs)
    for obj_key, obj in ours.items():
        assert obj == theirs[obj_key], f"{obj_key} differs from the chart's"


def test_a_secrets_host_joins_the_default_list_and_a_bad_secret_exits_2(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """claude-code's default list has no api.openai.com: `--secret openai=...` adds it, as a
    *_BASE_URL's host is added; a given list is not changed, and a bad --secret exits 2."""
    key = tmp_path / "key"
    key.write_text("sk-openai-0123456789")
    objs = manifest(sleeve, "--project", project, "--secret", f"openai={key}")
    env = {e["name"]: e.get("value") for e in pod_spec(objs)["containers"][0]["env"]}
    assert env["SIDECAR_EGRESS_ALLOW"].split(",")[-1] == "api.openai.com"
    res = sleeve("manifest", "--project", project, "--secret", f"openai={tmp_path}/missing")
    assert res.code == 2
    assert res.err == f"sleeve: --secret openai: {tmp_path}/missing does not exist\n"


def test_manifest_is_valid_for_the_oldest_and_newest_kubernetes_and_restricted(
    project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    for extra in ([], ["--token-secret", "mine"]):
        objs = manifest(sleeve, "--project", project, "--goal", "a\nb", *extra)
        validate_strict(objs)
        assert restricted_violations(pod_spec(objs)) == []


# Values a YAML 1.1 reader may take for numbers or bools; `12345e67` could be a slot id.
TRICKY = ["no", "on", "Yes", "~", "null", "0x1f", "12345e67", "0755", "1_000", "+1", ".5", "1e3"]


def test_go_yaml_reads_every_value_back_as_written(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """The YAML decoder of kubectl and the API server (sigs.k8s.io/yaml, here inside the real
    helm's `fromYaml`) reads every value back with its type: `12345e67` stays a string."""
    host = {f"SIDECAR_X{i}": v for i, v in enumerate(TRICKY)}
    res = sleeve("manifest", "--project", project, "--goal", "12345e67", extra_env=host)
    assert res.code == 0, res.err
    ours = documents(res.out)
    chart = tmp_path / "readback"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: readback\nversion: 0.1.0\n")
    for i, text in enumerate(res.out.split("\n---\n")):
        (chart / f"doc{i}.yaml").write_text(text)
    (chart / "templates" / "out.yaml").write_text(
        '{{ range $path, $_ := .Files.Glob "doc*.yaml" }}'
        "---\n{{ $.Files.Get $path | fromYaml | toJson }}\n{{ end }}"
    )
    back = documents(helm("template", "x", str(chart)).stdout)
    assert back == ours
    env = {e["name"]: e["value"] for e in pod_spec(back)["containers"][0]["env"]}
    assert env["SLEEVE_GOAL"] == "12345e67" and env["SIDECAR_X0"] == "no"


def test_kubectl_reads_the_manifest(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """Upstream kubectl takes the stream as it is (`kubectl kustomize` parses each document
    and names each object; `apply` would need a cluster)."""
    res = sleeve("manifest", "--project", project, "--name", "agent-k")
    assert res.code == 0, res.err
    (tmp_path / "sleeve.yaml").write_text(res.out)
    (tmp_path / "kustomization.yaml").write_text("resources: [sleeve.yaml]\n")
    done = run([tool("kubectl"), "kustomize", str(tmp_path)])
    names = sorted((o["kind"], o["metadata"]["name"]) for o in documents(done.stdout))
    assert names == [
        ("NetworkPolicy", "agent-k"),
        ("Secret", "agent-k-tokens"),
        ("Service", "agent-k"),
        ("StatefulSet", "agent-k"),
    ]


def test_manifest_and_run_share_one_plan(
    project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    """The variables both runtimes set come out the same: they are built by the same code."""
    host = {"SIDECAR_RESTART": "always", "SLEEVE_REPO": "r"}
    common = ["--project", str(project), "--slot", "1", "--cli", "shell", "--goal", "g o a l"]
    run_res = sleeve("run", *common, "--runtime", "docker", "--dry-run", extra_env=host)
    assert run_res.code == 0, run_res.err
    argv = shlex.split(run_res.out)
    flags = [a for f, a in itertools.pairwise(argv) if f == "--env"]
    docker_env = dict(a.split("=", 1) for a in flags if "=" in a)
    by_name = {a for a in flags if "=" not in a}  # docker copies these from the client
    objs = manifest(sleeve, *common, **host)
    pod_env = {e["name"]: e["value"] for e in pod_spec(objs)["containers"][0]["env"]}
    # SLEEVE_NAME differs: a pod is named by its slot, a run by its id (as `sleeve ps` shows it).
    shared = ("HOME", "SLEEVE_CLI", "SLEEVE_GOAL", "SIDECAR_WORKSPACE", "SIDECAR_STATE_DIR")
    assert {k: pod_env[k] for k in shared} == {k: docker_env[k] for k in shared}
    assert set(host) <= by_name
    assert {k: pod_env[k] for k in host} == host
    assert pod_env["SLEEVE_NAME"] == slot_id and pod_env["SLEEVE_GOAL"] == "g o a l"
    # The cluster's own choices: ttyd on a unix socket, tokens from files.
    assert "TTYD_PORT" not in pod_env and "TTYD_PORT" not in docker_env
    assert pod_env["SIDECAR_TOKEN_FILE"] == "/etc/sleeve/tokens/token"


def test_no_secret_of_the_host_reaches_the_output(
    project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("manifest", "--project", project, extra_env=HOST_SECRETS)
    assert res.code == 0, res.err
    for value in HOST_SECRETS.values():
        assert value not in res.out and value not in res.err
    tokens = by_kind(documents(res.out))["Secret"]["data"]
    decoded = {base64.b64decode(v).decode() for v in tokens.values()}
    assert not decoded & set(HOST_SECRETS.values())
    # The hint names the API-key variables, never their values.
    assert '--from-literal=ANTHROPIC_API_KEY="$ANTHROPIC_API_KEY"' in res.err
    assert f"sleeve-my-project-{slot_id}-api-keys" in res.err


def test_tokens_are_kept_per_cluster_sleeve(
    home: Path, project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    """A second render keeps the tokens the pod read; another name or namespace gets others."""

    def secret(*args: str) -> Obj:
        return by_kind(manifest(sleeve, "--project", project, *args))["Secret"]["data"]

    first = secret()
    assert secret() == first
    assert secret("--namespace", "other") != first
    assert secret("--name", "agent-c") != first
    kept = home / "kube" / f"default_sleeve-my-project-{slot_id}.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    stored = json.loads(kept.read_text())
    assert base64.b64decode(first["token"]).decode() == stored["token"]
    # an existing Secret instead: none rendered, the pod mounts that one, nothing stored
    objs = manifest(sleeve, "--project", project, "--name", "agent-d", "--token-secret", "mine")
    assert "Secret" not in by_kind(objs)
    volumes = {v["name"]: v for v in pod_spec(objs)["volumes"]}
    assert volumes["tokens"]["secret"]["secretName"] == "mine"
    assert not (home / "kube" / "default_agent-d.json").exists()


def test_termination_grace_follows_the_stop_grace(
    project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    for grace, period in (("5", 30), ("2.5", 30), ("40", 45), ("600", 605)):
        spec = pod_spec(manifest(sleeve, "--project", project, SIDECAR_STOP_GRACE=grace))
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["SIDECAR_STOP_GRACE"] == grace
        assert spec["terminationGracePeriodSeconds"] == period > float(grace)


def test_slot_choice_and_default_name(
    tmp_path: Path, home: Path, sleeve: Callable[..., Result]
) -> None:
    long = tmp_path / ("A Very Long Project Name With Spaces And Ümlauts " * 2).strip()
    long.mkdir()
    # no slot yet: slot 1's id, as `sleeve create` will make it; nothing is created
    objs = manifest(sleeve, "--project", long)
    name = by_kind(objs)["StatefulSet"]["metadata"]["name"]
    assert len(name) <= 52 and name.startswith("sleeve-a-very-long-project-name")
    assert not (home / "projects").exists()
    first = json.loads(sleeve("create", "--project", long, "--json").out)
    second = json.loads(sleeve("create", "--project", long, "--json").out)
    assert name.endswith(first["id"])
    assert sleeve("rm", "--project", long, "1").code == 0
    # the first live slot is now 2
    objs = manifest(sleeve, "--project", long)
    assert by_kind(objs)["StatefulSet"]["metadata"]["name"].endswith(second["id"])


def test_logged_in_slot_gets_a_seeding_hint(
    project: Path, slot_id: str, home: Path, sleeve: Callable[..., Result]
) -> None:
    slot_dir = next((home / "projects").iterdir()) / slot_id
    creds = slot_dir / ".claude" / ".credentials.json"
    creds.write_text('{"claudeAiOauth": {"refreshToken": "rt-never-printed"}}')
    res = sleeve("manifest", "--project", project, "--name", "agent-e")
    assert res.code == 0, res.err
    assert "rt-never-printed" not in res.out + res.err
    assert "create secret generic agent-e-claude-credentials" in res.err
    assert f"--from-file=.credentials.json={creds}" in res.err


# -- bad input ---------------------------------------------------------------------------

BAD = {
    "name with capitals": (["--name", "Agent-A"], "--name 'Agent-A' is not a usable name"),
    "name with underscore": (["--name", "agent_a"], "DNS-1123 label"),
    "name ending in a dash": (["--name", "agent-"], "DNS-1123 label"),
    "name starting with a digit": (["--name", "1agent"], "starting with a letter"),
    "name too long": (["--name", "a" * 53], "at most 52 characters"),
    "namespace with a space": (["--namespace", "team a"], "--namespace 'team a' is not a DNS"),
    "namespace too long": (["--namespace", "n" * 64], "at most 63 characters"),
    "unknown cli": (["--cli", "claude-kode"], "--cli 'claude-kode' is not a known CLI (known: "),
    "slot that does not exist": (["--slot", "7"], "no slot 7 for"),
    "slot zero": (["--slot", "0"], "no slot 0 for"),
    "image with spaces": (["--image", "sleeve: latest"], "--image 'sleeve: latest' is not an"),
    "image with a space inside": (["--image", "my image:1"], "is not an image reference"),
    "image with upper case path": (["--image", "Sleeve:1"], "is not an image reference"),
}


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_input_exits_2_with_one_line(
    case: tuple[list[str], str],
    home: Path,
    project: Path,
    slot_id: str,
    sleeve: Callable[..., Result],
) -> None:
    args, said = case
    res = sleeve("manifest", "--project", project, *args)
    assert res.code == 2, res
    assert res.out == ""
    assert res.err.count("\n") == 1 and res.err.startswith("sleeve: ") and said in res.err
    assert not (home / "kube").exists()  # nothing kept for a manifest never printed


def test_dead_slot_and_bad_stop_grace_exit_2(
    home: Path, project: Path, slot_id: str, sleeve: Callable[..., Result]
) -> None:
    assert sleeve("create", "--project", project).code == 0
    assert sleeve("rm", "--project", project, "1").code == 0
    res = sleeve("manifest", "--project", project, "--slot", "1")
    assert (res.code, res.out) == (2, "") and "slot 1 does not exist" in res.err
    res = sleeve("manifest", "--project", project, extra_env={"SIDECAR_STOP_GRACE": "soon"})
    assert (res.code, res.out) == (2, "") and "SIDECAR_STOP_GRACE" in res.err
    assert not (home / "kube").exists()


def test_manifest_imports_neither_aiohttp_nor_libtmux(project: Path, env: dict[str, str]) -> None:
    code = (
        "import sys; from sidecar.launcher.cli import main; rc = main(sys.argv[1:]);"
        "bad = {'aiohttp', 'libtmux'} & set(sys.modules); assert not bad, bad; raise SystemExit(rc)"
    )
    done = subprocess.run(
        [os.sys.executable, "-c", code, "manifest", "--project", str(project)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load_all(done.stdout)
