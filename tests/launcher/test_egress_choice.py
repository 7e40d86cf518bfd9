"""`sleeve run/manifest --egress default|open|FILE`: the default list of the CLI it runs (from
the one shipped data file), a user's file checked on the host, and `open` said out loud."""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Callable
from pathlib import Path

from sidecar.egress.allowlist import parse_list, split_file
from sidecar.launcher.egress_lists import default_patterns, default_text
from sidecar.launcher.plan import HOST_ONLY
from tests.kubetools import by_kind, documents, pod_spec

from .helpers import Result


def docker_envs(
    sleeve: Callable[..., Result], project: Path, *args: str
) -> tuple[dict[str, str], str]:
    res = sleeve("run", "--project", project, "--dry-run", "--runtime", "docker", *args)
    assert res.code == 0, res.err
    argv = shlex.split(res.out.splitlines()[0])
    envs = [b for a, b in itertools.pairwise(argv) if a == "--env"]
    return dict(e.partition("=")[::2] for e in envs), res.err


def test_default_list_is_the_clis_part_of_the_data_file() -> None:
    # The whole file is an allow file as it is (copied and passed with --egress FILE).
    whole = parse_list("copy", split_file(default_text())).texts
    assert set(default_patterns("opencode")) <= set(whole)
    claude = default_patterns("claude-code")
    assert "api.anthropic.com" in claude and "registry.npmjs.org" in claude
    assert "pypi.org" in claude and "github.com" in claude
    assert "api.openai.com" not in claude
    assert "api.openai.com" in default_patterns("codex")
    assert "generativelanguage.googleapis.com" in default_patterns("gemini-cli")
    # A CLI of the user's own gets the part for every CLI.
    assert set(default_patterns("my-cli")) < set(claude)
    sample = "a.example\n# [x]\nb.example\n# [y]\nc.example\n"
    assert default_patterns("x", sample) == ("a.example", "b.example")


def test_run_passes_the_default_list_and_never_the_hosts_own(
    project: Path, sleeve: Callable[..., Result]
) -> None:
    env, _ = docker_envs(sleeve, project)
    assert env["SIDECAR_EGRESS_ALLOW"] == ",".join(default_patterns("claude-code"))
    shell, _ = docker_envs(sleeve, project, "--shell")
    assert shell["SIDECAR_EGRESS_ALLOW"] == ",".join(default_patterns("shell"))
    assert {"SIDECAR_EGRESS_ALLOW", "SIDECAR_EGRESS_ALLOW_FILE"} <= HOST_ONLY


def test_open_is_said_and_sets_nothing(project: Path, sleeve: Callable[..., Result]) -> None:
    env, err = docker_envs(sleeve, project, "--egress", "open")
    assert "SIDECAR_EGRESS_ALLOW" not in env
    assert "--egress open: the agent's network is open" in err


def test_a_file_is_checked_on_the_host(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    good = tmp_path / "allow.txt"
    good.write_text("# ours\nAPI.example.com\n*.corp.example:8443\n")
    env, _ = docker_envs(sleeve, project, "--egress", str(good))
    assert env["SIDECAR_EGRESS_ALLOW"] == "api.example.com,*.corp.example:8443"
    nothing = tmp_path / "none.txt"
    nothing.write_text("none\n")
    env, _ = docker_envs(sleeve, project, "--egress", str(nothing))
    assert env["SIDECAR_EGRESS_ALLOW"] == "none"
    bad = tmp_path / "bad.txt"
    bad.write_text("https://api.example.com\n")
    res = sleeve("run", "--project", project, "--dry-run", "--egress", str(bad))
    assert res.code == 1
    assert f"--egress {bad}: pattern 'https://api.example.com': no scheme" in res.err
    res = sleeve("run", "--project", project, "--dry-run", "--egress", str(tmp_path / "missing"))
    assert res.code == 1 and "give default, open or a file" in res.err


def test_manifest_takes_the_same_list_and_its_network_policy(
    tmp_path: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("manifest", "--project", project)
    assert res.code == 0, res.err
    objs = documents(res.out)
    env = {e["name"]: e.get("value") for e in pod_spec(objs)["containers"][0]["env"]}
    assert env["SIDECAR_EGRESS_ALLOW"] == ",".join(default_patterns("claude-code"))
    policy = by_kind(objs)["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Egress"]
    assert [sorted(p["port"] for p in rule["ports"]) for rule in policy["egress"]] == [
        [53, 53],
        [80, 443],
    ]
    res = sleeve("manifest", "--project", project, "--egress", "open")
    objs = documents(res.out)
    assert "NetworkPolicy" not in by_kind(objs)
    assert "SIDECAR_EGRESS_ALLOW" not in {e["name"] for e in pod_spec(objs)["containers"][0]["env"]}
    bad = tmp_path / "bad.txt"
    bad.write_text("*\n")
    res = sleeve("manifest", "--project", project, "--egress", str(bad))
    assert res.code == 2 and "bare *" in res.err and len(res.err.strip().splitlines()) == 1
