"""The files the sidecar trusts outside its state dir (`Config.trusted_paths`: the policy, the
allowlist, the CLI registry, the secrets file, the audit and record dirs) are out of the agent's
reach. One-uid mode (a uid that owns them all, as the restricted pod) and a root CLI: the egress
fence keeps them, while the CLI still writes its workspace and HOME; each attack is also run
unguarded, where it works, so the refusal is the guard's. SIDECAR_USER: a start where that
user could change one is refused (exit 2) naming it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.config import Config, ConfigError, Recording, trusted
from sidecar.egress.fence import fence_of
from sidecar.security.users import parse_user
from tests.clitools import run_dir
from tests.commands import run_sidecar
from tests.harness import running_sidecar, wait_for, write_cli_config
from tests.redteam.guardtools import NOBODY, guarded, run_as

__all__ = ["run_dir"]  # the fixture, imported for pytest

REWRITES = Path(__file__).resolve().parent / "rewrites.py"
POLICY = "rules:\n  - name: deny-x\n    match: {kind: egress, host: x.example}\n    action: deny\n"
SECRET = {"name": "api", "env": "API_KEY", "from_env": "API_VALUE", "hosts": ["example.com"]}
TRUSTED_VARS = {
    "SIDECAR_POLICY_FILE",
    "SIDECAR_EGRESS_ALLOW_FILE",
    "SIDECAR_CLI_CONFIG",
    "SIDECAR_SECRETS_FILE",
    "SIDECAR_AUDIT_DIR",
    "SIDECAR_RECORD_DIR",
}
REFUSED = {"EACCES", "EPERM"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the CLI as other uids")


def configured(shared: Path, uid: int) -> Config:
    """A one-uid sidecar's configuration with every trusted file and dir outside its state
    dir, all of `shared` owned by `uid`."""
    conf = shared / "conf"
    conf.mkdir()
    (conf / "policy.yaml").write_text(POLICY)
    (conf / "allow.txt").write_text("example.com\n")
    (conf / "clis.yaml").write_text("clis: {}\n")
    (conf / "secrets.yaml").write_text(json.dumps({"secrets": [SECRET]}))
    for name in ("audit", "records", "ws", "home/.config", "state"):
        (shared / name).mkdir(parents=True)
    (shared / "audit" / "audit.jsonl").write_text("{}\n")
    (shared / "records" / "1.cast").write_text("{}\n")
    for path in [shared, *shared.rglob("*")]:
        os.chown(path, uid, uid)
    env = {
        "SLEEVE_NAME": "a",
        "SLEEVE_CLI": "shell",
        "PATH": os.environ["PATH"],
        "HOME": str(shared / "home"),
        "SIDECAR_WORKSPACE": str(shared / "ws"),
        "SIDECAR_STATE_DIR": str(shared / "state"),
        "SIDECAR_POLICY_FILE": str(conf / "policy.yaml"),
        "SIDECAR_EGRESS_ALLOW_FILE": str(conf / "allow.txt"),
        "SIDECAR_CLI_CONFIG": str(conf / "clis.yaml"),
        "SIDECAR_SECRETS_FILE": str(conf / "secrets.yaml"),
        "API_VALUE": "a-real-value-of-the-api",
        "SIDECAR_AUDIT_DIR": str(shared / "audit"),
        "SIDECAR_RECORD_DIR": str(shared / "records"),
    }
    return Config.from_env(env)


def attacks(shared: Path, tag: str) -> tuple[list[list[str]], list[list[str]]]:
    """The changes to the trusted files and dirs, and those in the CLI's own places."""
    files = [str(shared / "conf" / n) for n in ("policy.yaml", "allow.txt", "clis.yaml")]
    files.append(str(shared / "conf" / "secrets.yaml"))
    dirs = [shared / "audit", shared / "records"]
    against = [["create", str(shared / "conf" / tag)]]
    against += [[op, f] for f in files for op in ("append", "rename")]
    for folder in dirs:
        inside = str(next(p for p in folder.iterdir() if p.is_file()))
        against += [["create", str(folder / tag)], ["append", inside], ["rename", inside]]
        against += [["rename", str(folder)], ["unlink", inside]]
    against += [["unlink", f] for f in files]
    home, ws = shared / "home", shared / "ws"
    own = [["create", str(ws / tag)], ["mkdir", str(ws / f"{tag}.d")]]
    own += [["create", str(home / tag)], ["create", str(home / ".config" / tag)]]
    own += [["rename", str(home / tag)], ["mkdir", str(home / f"{tag}.d")]]
    own += [["unlink", str(home / tag)]]
    return against, own


def tried(uid: int, argv: list[str], ops: list[list[str]]) -> dict[str, str]:
    done = run_as(uid, [*argv, str(REWRITES), json.dumps(ops)])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def cli_report(report: Path) -> dict[str, str]:
    """What rewrites.py, run as a sidecar's CLI, wrote to `report`."""
    found = wait_for(
        lambda: json.loads(report.read_text()) if report.exists() else None,
        timeout=15,
        what="the CLI's report",
    )
    return found  # type: ignore[no-any-return]


@pytest.mark.parametrize("uid", [0, NOBODY], ids=["root-cli", "one-uid"])
def test_a_guarded_cli_changes_no_trusted_file_but_writes_its_workspace_and_home(
    shared: Path, uid: int
) -> None:
    config = configured(shared, uid)
    assert {name for name, _ in config.trusted_paths} == TRUSTED_VARS
    trusted.check(config)  # none lies in the CLI's places
    fence = fence_of(
        config.paths,
        one_uid=True,
        root_cli=uid == 0,
        writable=[config.workspace, shared / "home"],
        trusted=[path for _, path in config.trusted_paths],
    )
    against, own = attacks(shared, "guarded")
    got = tried(uid, list(guarded([sys.executable], fence=fence)), against + own)
    assert {k: v for k, v in got.items() if v not in REFUSED} == {" ".join(op): "ok" for op in own}
    free_against, free_own = attacks(shared, "free")
    free = tried(uid, [sys.executable], free_against + free_own)
    assert set(free.values()) == {"ok"}


def test_a_real_sidecars_root_cli_changes_no_trusted_file(tmp_path: Path) -> None:
    """The supervisor's own fence (the egress guard around a root CLI, the one-uid mode's
    shape): the CLI's attempts on the configuration, audit and record files are refused, its
    workspace and HOME are its own."""
    policy, allow, clis = tmp_path / "policy.yaml", tmp_path / "allow.txt", tmp_path / "clis.yaml"
    policy.write_text(POLICY)
    allow.write_text("example.com\n")
    audit, records = tmp_path / "audit", tmp_path / "records"
    ws, home = tmp_path / "workspace", tmp_path / "home"
    home.mkdir()
    against = [["append", str(p)] for p in (policy, allow, clis)]
    against += [["create", str(audit / "forged")], ["create", str(records / "forged.cast")]]
    own = [["create", str(ws / "mine")], ["create", str(home / "mine")]]
    report = ws / "report.json"
    command = [sys.executable, str(REWRITES), json.dumps(against + own), str(report)]
    write_cli_config(clis, {"rewrites": {"command": command}})
    extra = {
        "SIDECAR_CLI_CONFIG": str(clis),
        "SIDECAR_POLICY_FILE": str(policy),
        "SIDECAR_EGRESS_ALLOW_FILE": str(allow),
        "SIDECAR_AUDIT_DIR": str(audit),
        "SIDECAR_RECORD_DIR": str(records),
    }
    with running_sidecar(tmp_path, cli="rewrites", env_extra=extra) as sc:
        sc.start(wait_healthy=False)  # rewrites.py exits once written: its report is the sign
        got = cli_report(report)
    assert {k: v for k, v in got.items() if v not in REFUSED} == {" ".join(op): "ok" for op in own}


@pytest.mark.parametrize("in_tmp", [True, False], ids=["beneath-tmp", "beneath-run"])
def test_a_root_cli_makes_entries_in_tmp_unless_a_kept_path_is_beneath_it(
    tmp_path: Path, run_dir: Callable[[], Path], in_tmp: bool
) -> None:
    """Nothing configured away: Landlock keeps the state dir and the CLI registry by granting
    everything around them, so with them beneath /tmp the guarded root CLI can make no new
    entry directly in /tmp (Claude Code makes /tmp/claude-UID at its first start on a machine
    and exits 1 when it cannot), and /status names each one; with them under /run (as in a
    sleeve) it can, and nothing is said."""
    if in_tmp:
        base = Path(tempfile.mkdtemp(prefix="sc-", dir="/tmp"))
    else:
        base = run_dir()
        base.mkdir(mode=0o700)
    probe = Path("/tmp", f"sc-probe-{uuid.uuid4().hex}")
    report = tmp_path / "workspace" / "report.json"
    command = [sys.executable, str(REWRITES), json.dumps([["create", str(probe)]]), str(report)]
    clis = write_cli_config(base / "clis.yaml", {"rewrites": {"command": command}})
    extra = {
        "SIDECAR_CLI_CONFIG": str(clis),
        "SIDECAR_STATE_DIR": str(base / "state"),
        "SIDECAR_EGRESS_ALLOW": "none",
    }
    try:
        with running_sidecar(tmp_path, cli="rewrites", env_extra=extra) as sc:
            sc.start(wait_healthy=False)  # the CLI exits once written: its report is the sign
            got = cli_report(report)  # the warnings are made before the CLI starts
            warned = [w for w in sc.status()["warnings"] if "is beneath" in w]
    finally:
        probe.unlink(missing_ok=True)
        if in_tmp:
            shutil.rmtree(base, ignore_errors=True)
    if in_tmp:
        assert got == {f"create {probe}": "EACCES"}
        assert warned == [
            f"{name} {path} is beneath /tmp: the guarded CLI can make no new entry directly in "
            "/tmp; keep it outside /tmp"
            for name, path in (("SIDECAR_STATE_DIR", base / "state"), ("SIDECAR_CLI_CONFIG", clis))
        ]
    else:
        assert (got, warned) == ({f"create {probe}": "ok"}, [])


@pytest.mark.parametrize("place", ["ws", "home/.config"], ids=["workspace", "home"])
def test_a_trusted_file_in_the_clis_places_is_refused_in_one_uid_mode(
    tmp_path: Path, place: str
) -> None:
    (tmp_path / place).mkdir(parents=True)
    policy = tmp_path / place / "policy.yaml"
    policy.write_text(POLICY)
    env = {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "HOME": str(tmp_path / "home")}
    done = run_sidecar({**env, "SIDECAR_POLICY_FILE": str(policy)}, tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"SIDECAR_POLICY_FILE: {policy} overlaps" in done.stderr
    assert "the agent can write there" in done.stderr


def test_with_sidecar_user_a_policy_that_user_can_replace_stops_the_start(shared: Path) -> None:
    """The real start (exit 2, one line) for a policy file in a directory the user may write."""
    folder = shared / "conf"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # as a umask would not leave it
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    env = {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "SIDECAR_USER": f"{NOBODY}:{NOBODY}"}
    done = run_sidecar({**env, "SIDECAR_POLICY_FILE": str(policy)}, shared)
    assert done.returncode == 2, done.stderr
    assert f"SIDECAR_POLICY_FILE: {policy} can be changed by the CLI's user" in done.stderr
    assert f"{folder} above it lets it rename entries (mode 0777" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


CASES = {
    "owned by the user": (0o600, NOBODY, 0o755, "belongs to it"),
    "writable by its group": (0o664, 0, 0o755, "lets it write (mode 0664"),
    "in a dir it owns": (0o644, 0, 0o755, "above it belongs to it"),
    "in a dir it may write": (0o644, 0, 0o777, "above it lets it rename entries"),
    "root's in a sticky dir": (0o644, 0, 0o1777, None),
    "root's, read-only": (0o644, 0, 0o755, None),
}


@pytest.mark.parametrize(("mode", "owner", "dir_mode", "says"), CASES.values(), ids=CASES)
def test_with_sidecar_user_each_way_to_change_a_trusted_file_is_named(
    shared: Path, mode: int, owner: int, dir_mode: int, says: str | None
) -> None:
    user = parse_user(f"{NOBODY}:{NOBODY}")
    folder = shared / "conf"
    folder.mkdir()
    folder.chmod(dir_mode)
    if says == "above it belongs to it":
        os.chown(folder, NOBODY, 0)
    policy = folder / "policy.yaml"
    policy.write_text(POLICY)
    policy.chmod(mode)
    os.chown(policy, owner, NOBODY)
    config = Config("a", "shell", user=user, workspace=shared / "ws", policy_file=policy)
    if says is None:
        trusted.check(config)
        return
    with pytest.raises(ConfigError, match="SIDECAR_POLICY_FILE") as caught:
        trusted.check(config)
    assert says in str(caught.value) and user.spec in str(caught.value)


def test_with_sidecar_user_a_missing_record_dir_it_could_make_is_refused(shared: Path) -> None:
    # `shared` is sticky: only a missing entry can be had there, by making it first.
    user = parse_user(f"{NOBODY}:{NOBODY}")
    records = shared / "records"
    recording = Recording(dir=records)
    config = Config("a", "shell", user=user, workspace=shared / "ws", recording=recording)
    with pytest.raises(ConfigError, match=f"SIDECAR_RECORD_DIR: {records} can be changed"):
        trusted.check(config)


def test_a_home_of_root_refuses_no_trusted_path(shared: Path) -> None:
    """A uid without a passwd entry often gets HOME=/: every path is beneath it, yet the fence
    splits / in any case, so that alone refuses nothing; the workspace still does."""
    policy = shared / "policy.yaml"
    config = Config(
        "a", "shell", workspace=shared / "ws", policy_file=policy, child_env={"HOME": "/"}
    )
    trusted.check(config)
    inside = Config("a", "shell", workspace=shared, policy_file=policy, child_env={"HOME": "/"})
    with pytest.raises(ConfigError, match="overlaps the workspace"):
        trusted.check(inside)
