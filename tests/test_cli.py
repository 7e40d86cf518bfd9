"""`sidecar status|screen|outbox|inbox|send|resleeve|events|attach` against a real sidecar, as
a person debugging with `docker exec` would run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from tests.commands import CLI_TOKEN, sidecar_cmd
from tests.harness import REPO, Sidecar, wait_for
from tests.proctools import terminal_clients


def test_status_human_and_json(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN, "SLEEVE_GOAL": "debug me"}).start()
    human = sidecar_cmd(sc, "status")
    assert human.returncode == 0, human.stderr
    assert "test-sleeve" in human.stdout
    assert "debug me" in human.stdout
    assert "healthy" in human.stdout
    machine = sidecar_cmd(sc, "status", "--json")
    assert json.loads(machine.stdout)["current_task"] == "debug me"


def test_screen_human_and_json(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN}).start()
    sc.post("/input", {"text": "echo SCREEN-CHECK-$((6*7))"})

    def shown() -> subprocess.CompletedProcess[str] | None:
        human = sidecar_cmd(sc, "screen")
        assert human.returncode == 0, human.stderr
        return human if "SCREEN-CHECK-42" in human.stdout else None

    human = wait_for(shown, what="the echo on `sidecar screen`")
    lines = human.stdout.split("\n")
    assert len(lines) < 50  # the empty rows below the prompt are left out
    assert lines[-1] == ""  # and the output ends with a newline
    machine = json.loads(sidecar_cmd(sc, "screen", "--json").stdout)
    assert (machine["rows"], machine["cols"]) == (50, 200)
    assert len(machine["lines"]) == 50
    assert machine["lines"][: len(lines) - 1] == lines[:-1]
    assert set(machine["cursor"]) == {"row", "col"}


def test_wrong_token_and_unreachable_sidecar_fail_with_one_clear_line(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN}).start()
    bad = sidecar_cmd(sc, "status", token="nope")
    assert bad.returncode == 1
    assert "401" in bad.stderr
    assert "Traceback" not in bad.stderr
    sc.stop()
    gone = sidecar_cmd(sc, "status")
    assert gone.returncode == 1
    assert "cannot reach the sidecar" in gone.stderr


def test_the_client_reads_its_token_file_with_the_sidecars_checks(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """A token file is read as the sidecar reads it: a good one (CRLF-ended) works; a FIFO,
    a directory or both the variable and the file fail at once with one line naming them,
    before any request (the FIFO is never read: nothing writes to it, so a read would hang)."""
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN}).start()
    good = sc.tmp / "token"
    good.write_text(CLI_TOKEN + "\r\n")
    ok = sidecar_cmd(
        sc, "status", "--json", token=None, env_extra={"SIDECAR_TOKEN_FILE": str(good)}
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["sleeve_id"] == "test-sleeve"
    fifo = sc.tmp / "token-fifo"
    os.mkfifo(fifo)
    for extra, needle in [
        ({"SIDECAR_TOKEN_FILE": str(fifo)}, "is not a regular file"),
        ({"SIDECAR_TOKEN_FILE": str(sc.tmp)}, "is a directory"),
        ({"SIDECAR_TOKEN_FILE": str(good), "SIDECAR_TOKEN": CLI_TOKEN}, "are both set"),
    ]:
        bad = sidecar_cmd(sc, "status", token=None, env_extra=extra)
        assert bad.returncode == 1, bad.stdout
        assert bad.stderr.startswith("sidecar status: SIDECAR_TOKEN"), bad.stderr
        assert needle in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_send_inbox_outbox_and_resleeve(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN}).start()
    sent = sidecar_cmd(
        sc,
        "send",
        "--from",
        "envoy",
        "--type",
        "task",
        "--thread",
        "t1",
        "-",
        stdin="Do the thing\nnow",
    )
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("sent msg-")
    inbox = json.loads(sidecar_cmd(sc, "inbox", "--json").stdout)
    [message] = inbox["messages"]
    assert (message["from"], message["type"], message["thread"], message["content"]) == (
        "envoy",
        "task",
        "t1",
        "Do the thing\nnow",
    )
    assert "envoy" in sidecar_cmd(sc, "inbox").stdout
    assert "(no messages)" in sidecar_cmd(sc, "outbox").stdout
    resleeve = sidecar_cmd(sc, "resleeve", "--cli", "shell")
    assert resleeve.returncode == 0
    assert "resleeving to shell" in resleeve.stdout
    unknown = sidecar_cmd(sc, "resleeve", "--cli", "nope")
    assert unknown.returncode == 1
    assert "unknown CLI" in unknown.stderr


def test_events_prints_ndjson(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SIDECAR_PORT": str(sc.port)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "events"], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        assert json.loads(proc.stdout.readline())["type"] == "heartbeat"  # subscribed
        assert sc.post("/resleeve", {})[0] == 202
        event = json.loads(proc.stdout.readline())
        while event["type"] == "agent-state":  # the shell's own, at any moment
            event = json.loads(proc.stdout.readline())
        assert (event["type"], event["phase"]) == ("resleeve", "started")
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def test_events_ends_with_exit_0_on_shutdown_and_one_line_when_the_sidecar_dies(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    def follow(sc: Sidecar) -> subprocess.Popen[str]:
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "SIDECAR_PORT": str(sc.port)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "events"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["type"] == "heartbeat"  # subscribed
        return proc

    polite = make_sidecar().start()
    proc = follow(polite)
    assert polite.stop() == 0
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err  # the stream ended as a stream ends

    killed = make_sidecar().start()
    proc = follow(killed)
    killed.kill_everything()  # SIGKILL: the stream breaks off mid-way
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "broke off" in err
    assert "Traceback" not in err


def test_attach_without_a_sidecar_says_why(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar()
    result = sidecar_cmd(sc, "attach")
    assert result.returncode == 1
    assert "no tmux socket" in result.stderr


def test_attach_execs_tmux_on_the_sidecar_socket(make_sidecar: Callable[..., Sidecar]) -> None:
    """attach needs a terminal: run it inside a second tmux server, the way a person would."""
    sc = make_sidecar().start()
    outer = str(sc.tmp / "outer.sock")
    env_args = [f"PYTHONPATH={REPO}", f"SIDECAR_STATE_DIR={sc.state_dir}"]
    subprocess.run(
        [
            "tmux",
            "-S",
            outer,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "30",
            "env",
            *env_args,
            sys.executable,
            "-m",
            "sidecar",
            "attach",
        ],
        check=True,
    )
    try:
        wait_for(lambda: terminal_clients(sc), what="a client attached to session main")
    finally:
        subprocess.run(["tmux", "-S", outer, "kill-server"], check=False)
