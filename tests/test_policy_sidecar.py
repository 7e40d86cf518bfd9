"""The policy, the live allowlist and the audit trail in a real sidecar: a bad policy at start
exits 2 naming the file and the line; SIGHUP reads the policy and the allow file again (a bad
file keeps what is in force and says so once: log, event, `/status`); a record acknowledged is
on disk when the supervisor is killed right after; a full audit disk (a real tmpfs) keeps the
sidecar serving, says so, and loses nothing held once there is room; `sidecar policy check` and
`sidecar policy test` (against an audit trail with known decisions) and `sidecar audit`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.audit.records import ApprovalResolvedRecord
from sidecar.audit.trail import NAME, AuditTrail
from tests.agenttools import EventLog
from tests.commands import run_sidecar
from tests.faulttools import fill, small_disk
from tests.harness import REPO, Sidecar, http, wait_for
from tests.proctools import kill_supervisor, restarted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
GOOD = "rules:\n  - name: deny-x\n    match: {kind: egress, host: x.example}\n    action: deny\n"


def client(sc: Sidecar, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**sc.env(), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("rules:\n  - name: a\n    action: maybe\n", ":3: rule 'a': action must be one of"),
        ("rules: {}\n", ":1: rules must be a list of rules"),
        ("a: &x 1\nrules: *x\n", ":1: anchors and aliases"),
    ],
)
def test_a_bad_policy_at_start_exits_2_naming_the_file_and_line(
    tmp_path: Path, text: str, says: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    done = run_sidecar(
        {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "SIDECAR_POLICY_FILE": str(policy)}, tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"sidecar: SIDECAR_POLICY_FILE: {policy}{says}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SIDECAR_EGRESS_ASK": "10"}, "SIDECAR_EGRESS_ASK needs SIDECAR_EGRESS_ALLOW"),
        ({"SIDECAR_EGRESS_ALLOW": "none", "SIDECAR_EGRESS_ASK": "soon"}, "SIDECAR_EGRESS_ASK must"),
        ({"SIDECAR_EGRESS_ALLOW": "none", "SIDECAR_EGRESS_ASK": "0"}, "between 0.5 and 600"),
        ({"SIDECAR_AUDIT_DIR": "/dev/null"}, "SIDECAR_AUDIT_DIR: /dev/null is not a directory"),
    ],
)
def test_bad_egress_ask_and_audit_dir_exit_2(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    done = run_sidecar({"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", **env}, tmp_path)
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_sighup_reads_the_policy_and_the_allow_file_again_and_a_bad_one_is_kept_out(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    policy, allow = tmp_path / "policy.yaml", tmp_path / "allow.txt"
    policy.write_text(GOOD)
    allow.write_text("a.example\n")
    sc = make_sidecar(
        env_extra={"SIDECAR_POLICY_FILE": str(policy), "SIDECAR_EGRESS_ALLOW_FILE": str(allow)}
    ).start()
    events = EventLog(sc)
    added = http("PATCH", sc.url + "/egress", {"add": ["kept.example"]})
    assert added.status == 200
    policy.write_text(GOOD + "  - name: two\n    match: {tool: Bash}\n    action: ask\n")
    allow.write_text("b.example\n")
    assert sc.proc is not None
    os.kill(sc.proc.pid, signal.SIGHUP)  # to init, which forwards it
    changed = events.wait(lambda e: e["type"] == "policy-changed", "policy-changed")
    assert (changed["rules"], changed.get("error")) == (2, None)
    hup = events.wait(
        lambda e: e["type"] == "egress-changed" and e["by"] == "reload", "egress-changed"
    )
    assert (hup["by"], hup["added"], hup["removed"]) == ("reload", ["b.example"], ["a.example"])
    assert sc.get("/egress").body["allow"] == ["b.example", "kept.example"]

    policy.write_text("rules:\n  - name: broken\n    action: nope\n")
    allow.write_text("https://c.example\n")
    os.kill(sc.proc.pid, signal.SIGHUP)
    refused = events.wait(lambda e: e["type"] == "policy-changed" and e.get("error"), "refusal")
    os.kill(sc.proc.pid, signal.SIGHUP)  # told once, however often it is asked
    wait_for(lambda: sc.log().count("SIGHUP: done") == 3, 10, what="the third reload's end")
    assert f"{policy}:3: rule 'broken': action must be one of" in refused["error"]
    assert refused["rules"] == 2  # the policy in force

    def both_refused(status: dict[str, Any]) -> bool:
        said = status["warnings"]
        return any("SIDECAR_POLICY_FILE" in w and "stays in force" in w for w in said) and any(
            "SIDECAR_EGRESS_ALLOW_FILE" in w and "no scheme" in w for w in said
        )

    sc.wait_status(both_refused, lambda: f"both refusals in {sc.status()['warnings']}")
    wait_for(lambda: sc.log().count("action must be one of") == 1, 10, what="one log line")
    assert len([e for e in events.of("error") if "SIDECAR_POLICY_FILE" in e["message"]]) == 1
    assert sc.get("/egress").body["allow"] == ["b.example", "kept.example"]

    policy.write_text(GOOD)
    allow.write_text("b.example\n")
    os.kill(sc.proc.pid, signal.SIGHUP)
    # The policy is read after the allow file: its event says both are done.
    wait_for(
        lambda: len([e for e in events.of("policy-changed") if not e.get("error")]) == 2,
        10,
        what="the good policy read again",
    )
    assert not [w for w in sc.status()["warnings"] if "stays in force" in w]
    records = sc.get("/audit?type=policy-changed").body["records"]
    assert [(r["by"], r.get("error") is not None) for r in records] == [
        ("start", False), ("reload", False), ("reload", True), ("reload", False),
    ]  # fmt: skip


def test_a_sighup_during_a_reload_is_not_lost(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    """SIGHUPs sent faster than reloads run: the policy in force at the end is the last one
    saved, however the signals fell against the reloads."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(GOOD)
    sc = make_sidecar(env_extra={"SIDECAR_POLICY_FILE": str(policy)}).start()
    assert sc.proc is not None
    events = EventLog(sc)
    extra = "  - name: r{n}\n    match: {{tool: Bash}}\n    action: ask\n"
    for n in range(1, 31):
        draft = tmp_path / "policy.yaml.new"  # saved as an editor does: a rename over the file
        draft.write_text(GOOD + "".join(extra.format(n=k) for k in range(n)))
        draft.replace(policy)
        os.kill(sc.proc.pid, signal.SIGHUP)
    wait_for(
        lambda: [e["rules"] for e in events.of("policy-changed")][-1:] == [31],
        10,
        what=lambda: f"the last policy (31 rules) in force: {events.of('policy-changed')}",
    )
    assert not [e for e in events.of("policy-changed") if e.get("error")]


def test_a_record_acknowledged_is_on_disk_when_the_supervisor_dies_right_after(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_EGRESS_ALLOW": "none"}).start()
    for n in range(5):
        reply = http("PATCH", sc.url + "/egress", {"add": [f"h{n}.example"]})
        assert reply.status == 200
    kill_supervisor(sc)  # SIGKILL: nothing is flushed on the way out
    restarted(sc, 1)
    on_disk = [json.loads(line) for line in (sc.state_dir / NAME).read_text().splitlines()]
    added = [r["added"] for r in on_disk if r["type"] == "egress-changed"]
    assert added == [[f"h{n}.example"] for n in range(5)]


def test_a_full_audit_disk_keeps_the_sidecar_serving_and_loses_nothing_held(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    with small_disk(tmp_path / "audit", "64k") as disk:
        sc = make_sidecar(
            env_extra={"SIDECAR_EGRESS_ALLOW": "none", "SIDECAR_AUDIT_DIR": str(disk)}
        ).start()
        events = EventLog(sc)
        filler = fill(disk)
        for n in range(60):  # past the file's last page: the disk refuses
            assert http("PATCH", sc.url + "/egress", {"add": [f"h{n}.example"]}).status == 200
        status = sc.wait_status(
            lambda s: any("audit trail cannot be written" in w for w in s["warnings"]), "warning"
        )
        assert status["health"] == "healthy" and sc.get("/health").status == 200
        told = events.wait(lambda e: e["type"] == "error" and "audit" in e["message"], "event")
        assert "No space left on device" in told["message"]
        # Held records are read back too, before the disk takes them.
        held = sc.get("/audit?type=egress-changed&limit=100").body["records"]
        assert [r["added"] for r in held] == [[f"h{n}.example"] for n in range(60)]
        assert "sidecar_audit_failing 1" in sc.get("/metrics").body.decode()
        filler.unlink()
        sc.wait_status(
            lambda s: not any("audit trail" in w for w in s["warnings"]), "written again", 20
        )
        on_disk = [json.loads(line) for line in (disk / NAME).read_text().splitlines()]
        added = [r["added"] for r in on_disk if r["type"] == "egress-changed"]
        assert added == [[f"h{n}.example"] for n in range(60)]
        assert sc.stop() == 0


def test_policy_check_and_test_against_a_trail_with_known_decisions(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sc = make_sidecar()
    sc.state_dir.mkdir(mode=0o700, parents=True)

    def decided(id_: str, command: str, decision: Any, by: Any, rule: str | None = None) -> None:
        record = ApprovalResolvedRecord(
            id=id_,
            kind="tool",
            tool="Bash",
            summary=command,
            source="hooks",
            decision=decision,
            by=by,
            waited=0.5,
            cli="claude-code",
            rule=rule,
            command=command,
        )
        trail.write(record)

    async def write() -> None:
        nonlocal trail
        trail = AuditTrail(sc.state_dir, "test-sleeve")
        trail.open()
        decided("a1", "git status", "allow", "policy", "read-only")
        decided("a2", "git push --force", "allow", "api")
        decided("a3", "npm test", "allow", "api")
        decided("a4", "rm -rf /", "deny", "policy", "no-rm")
        await trail.synced()
        await trail.close()

    import asyncio

    trail: AuditTrail
    asyncio.run(write())
    sc.start()
    draft = tmp_path / "draft.yaml"
    draft.write_text(
        "rules:\n"
        "  - name: read-only\n    match: {command: '^git status'}\n    action: allow\n"
        "  - name: no-force\n    match: {command: 'git push .*--force'}\n    action: deny\n"
    )
    checked = client(sc, "policy", "check", str(draft))
    assert (checked.returncode, checked.stdout) == (0, f"{draft}: 2 rules, default ask\n")
    tested = client(sc, "policy", "test", str(draft))
    assert tested.returncode == 1, tested.stderr
    lines = tested.stdout.splitlines()
    assert len(lines) == 3, lines
    assert "a2 Bash: git push --force — was allow by api, now deny (rule no-force)" in lines[0]
    assert "a4 Bash: rm -rf / — was deny by policy (rule no-rm), now ask a person" in lines[1]
    assert lines[2] == "2 of 4 decisions would be decided differently"
    same = tmp_path / "same.yaml"
    same.write_text(
        "rules:\n"
        "  - name: read-only\n    match: {command: '^git status'}\n    action: allow\n"
        "  - name: no-rm\n    match: {command: 'rm -rf'}\n    action: deny\n"
    )
    assert client(sc, "policy", "test", str(same)).returncode == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: x\n    action: allow\n    match: {path: ../up}\n")
    refused = client(sc, "policy", "check", str(bad))
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"sidecar policy check: {bad}:4: rule 'x': path '../up'")
    printed = client(sc, "audit", "--type", "approval-resolved", "--limit", "2")
    assert printed.returncode == 0
    assert [line.split()[1] for line in printed.stdout.splitlines()] == ["approval-resolved"] * 2
    assert 'id="a4"' in printed.stdout.splitlines()[1]
    assert 'rule="no-rm"' in printed.stdout
