"""Recordings of real CLI runs under a real sidecar (real tmux, its control client's tap): one
asciicast v2 file per run, listed and served by the API (view token allowed) and by `sidecar
recordings`; the API token never in a file; a flood of output cut at the cap with a marker; what
the terminal showed read back by Debian's `asciinema cat`; a read-only or full directory costs the
recording, never the CLI, with one warning; a supervisor killed mid-recording leaves a valid file
that the next one goes on with; a resleeve and a heal start new runs; `SIDECAR_RECORD=off`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import REPO, Sidecar, bearer, http, py_cli, wait_for, write_cli_config
from tests.proctools import kill_supervisor, restarted
from tests.recordtools import asciinema_cat, markers, recording_lines

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
TOKEN = "recordings-admin-token-0123456789"
VIEW = "recordings-view-token-0123456789"


@pytest.fixture
def printer(make_sidecar: Callable[..., Sidecar]) -> Callable[..., Sidecar]:
    """A sidecar running tests/clis/printer.py with the given arguments (its CLI `printer`)."""

    def make(*args: str, **env: str) -> Sidecar:
        sc = make_sidecar(cli="printer")
        config = write_cli_config(sc.tmp / "clis.yaml", {"printer": py_cli("printer.py", *args)})
        sc.env_extra.update(SIDECAR_CLI_CONFIG=str(config), SIDECAR_TOKEN=TOKEN, **env)
        return sc

    return make


def shows(sc: Sidecar, text: str, timeout: float = 30) -> None:
    wait_for(lambda: any(text in line for line in sc.get("/screen")[1]["lines"]), timeout)


def listed(sc: Sidecar) -> list[dict]:
    code, body = sc.get("/recordings")
    assert code == 200, body
    return list(body["recordings"])


def file_of(sc: Sidecar, item: dict) -> Path:
    return sc.state_dir / "recordings" / f"{item['id']}.cast"


def test_the_routes_and_the_client_serve_a_run_with_the_token_redacted(
    printer: Callable[..., Sidecar],
) -> None:
    sc = printer("say", f"the token is {TOKEN}", SIDECAR_VIEW_TOKEN=VIEW).start()
    shows(sc, "the token is")
    [item] = listed(sc)
    assert item["cli"] == "printer" and item["ended"] is None and item["bytes"] > 0
    code, body = sc.get("/recordings", headers={"Authorization": f"Bearer {VIEW}"})
    assert code == 200 and body["recordings"][0]["id"] == item["id"]
    code, raw = sc.get(f"/recordings/{item['id']}", headers={"Authorization": f"Bearer {VIEW}"})
    assert code == 200 and isinstance(raw, bytes)
    assert raw.startswith(b'{"version":2') and TOKEN.encode() not in raw
    assert b"the token is [redacted]" in raw
    head = http("GET", f"{sc.url}/recordings/{item['id']}", token=TOKEN)
    assert head.status == 200
    for bad in ("nope", "..%2F..%2Fsupervisor.json", item["id"] + "x"):
        code, body = sc.get(f"/recordings/{bad}")
        assert code == 404 and "no recording" in body["error"], (bad, body)
    assert sc.get("/recordings")[0] == 200
    assert sc.get("/recordings", headers={})[0] == 401

    client = {**os.environ, "SIDECAR_PORT": str(sc.port), "SIDECAR_TOKEN": TOKEN}
    client["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "recordings"], env=client, capture_output=True, text=True
    )
    assert out.returncode == 0 and item["id"] in out.stdout and "printer" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "sidecar", "recordings", "--json"],
        env=client,
        capture_output=True,
        text=True,
    )
    assert json.loads(out.stdout)["recordings"][0]["id"] == item["id"]
    cast = subprocess.run(
        [sys.executable, "-m", "sidecar", "recordings", item["id"]], env=client, capture_output=True
    )
    assert cast.returncode == 0 and cast.stdout.startswith(b'{"version":2')
    missing = subprocess.run(
        [sys.executable, "-m", "sidecar", "recordings", "nope"],
        env=client,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "404" in missing.stderr


def test_a_flood_of_output_is_recorded_as_frames_and_the_cli_prints_it_all(
    printer: Callable[..., Sidecar],
) -> None:
    """100 MiB as fast as the pane takes it: the CLI prints it all; past the flood rate the
    recording holds a marker saying so and frames of the screen, a small part of the output."""
    sc = printer("flood", "100").start()
    shows(sc, "FLOOD DONE", timeout=120)
    wait_for(lambda: listed(sc)[0]["markers"] >= 2, 10, what="the flood's marker")
    [item] = listed(sc)
    assert item["bytes"] < 10 * 1024 * 1024
    assert sc.stop() == 0
    path = file_of(sc, item)
    assert "output too fast to record byte for byte: a frame a second" in markers(path)
    frames = [e for e in recording_lines(path)[1:] if e[1] == "o" and "\x1b[2J" in e[2]]
    assert len(frames) >= 2  # the first frame, and at least one of the flood


def test_the_cap_holds_and_a_recording_past_it_ends_with_a_marker(
    printer: Callable[..., Sidecar],
) -> None:
    sc = printer("flood", "100", SIDECAR_RECORD_MAX_MB="0.2").start()
    shows(sc, "FLOOD DONE", timeout=120)
    [item] = listed(sc)
    assert item["bytes"] <= 0.2 * 1024 * 1024
    assert sc.stop() == 0
    path = file_of(sc, item)
    assert path.stat().st_size <= 0.2 * 1024 * 1024
    events = recording_lines(path)[1:]
    assert events[-1][1] == "m" and events[-1][2].startswith("recording cut:"), events[-1]


def test_what_the_terminal_showed_replays_in_asciinema_cat(
    printer: Callable[..., Sidecar],
) -> None:
    """A clear-screen loop, invalid UTF-8 (U+FFFD), wide and combining characters: Debian's
    asciinema prints them back into a terminal that shows what the pane showed."""
    sc = printer("mixed").start()
    # /screen answers through the control client that taps the recording's bytes: once it
    # shows READY, what the CLI writes next is recorded as written.
    shows(sc, "READY")
    assert sc.post("/input", {"text": "go"}).status == 202
    shows(sc, "MIXED DONE")
    [item] = listed(sc)
    assert sc.stop() == 0
    path = file_of(sc, item)
    printed = "".join(e[2] for e in recording_lines(path)[1:] if e[1] == "o")
    assert "invalid: \ufffd\ufffd\ufffd end" in printed  # each invalid byte one U+FFFD
    screen = asciinema_cat(path, sc.tmp)
    assert "invalid:" in screen and " end" in screen
    assert "wide: 漢字カナ 🙂 combining: e\u0301 a\u0308" in screen
    assert "frame 49" in screen and "MIXED DONE" in screen
    assert markers(path)[-1] == "exited"


@pytest.fixture
def tmpfs(short_tmp: Path) -> Iterator[Callable[[str], Path]]:
    """A real tmpfs mounted with `options` (root only: the test skips otherwise)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        where = short_tmp / f"fs{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize("options", ["ro,size=1m", "size=64k"])
def test_a_read_only_or_full_directory_costs_the_recording_not_the_cli(
    printer: Callable[..., Sidecar], tmpfs: Callable[[str], Path], options: str
) -> None:
    where = tmpfs(options)
    sc = printer("flood", "2", SIDECAR_RECORD_DIR=str(where / "recordings"))
    sc.start()
    shows(sc, "FLOOD DONE", timeout=60)
    assert sc.post("/resleeve", {})[0] == 202  # a second run: still one warning
    sc.wait_status(lambda s: not s["resleeving"] and s["cli_running"], "resleeved")
    shows(sc, "FLOOD DONE", timeout=60)
    status = sc.status()
    assert status["cli_running"] and status["health"] == "healthy"
    warned = [w for w in status["warnings"] if "record" in w]
    assert len(warned) == 1, status["warnings"]
    lines = [json.loads(line) for line in sc.log().splitlines() if line.startswith("{")]
    said = [line for line in lines if line["level"] == "warning" and "record" in line["msg"]]
    assert len([s for s in said if "not said again" in s["msg"]]) == 1, said
    for path in (where / "recordings").glob("*.cast") if (where / "recordings").exists() else []:
        for line in path.read_text().splitlines():
            json.loads(line)  # a file the disk refused half way is valid to its last line


def test_a_supervisor_killed_mid_recording_leaves_a_valid_file_the_next_goes_on_with(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(cli="numbers")
    pidfile = sc.tmp / "numbers.pid"
    config = write_cli_config(
        sc.tmp / "clis.yaml", {"numbers": py_cli("numbers.py", "400", "0.01", str(pidfile))}
    )
    sc.env_extra["SIDECAR_CLI_CONFIG"] = str(config)
    sc.start()
    shows(sc, "line 000050")
    [before] = listed(sc)
    kill_supervisor(sc)
    path = file_of(sc, before)
    for line in path.read_text().splitlines():
        json.loads(line)  # valid up to its last complete event, as the dead one left it
    restarted(sc, 1)
    shows(sc, "numbers done")
    [after] = listed(sc)
    assert after["id"] == before["id"] and after["ended"] is None
    assert sc.stop() == 0
    labels = markers(path)
    assert "the sidecar's supervisor restarted; this run goes on" in labels, labels
    assert labels[-1] == "exited"
    printed = "".join(e[2] for e in recording_lines(path)[1:] if e[1] == "o")
    assert "numbers done" in printed


def test_a_resleeve_and_a_heal_start_new_runs(printer: Callable[..., Sidecar]) -> None:
    sc = printer("say", "RUN").start()
    shows(sc, "RUN")
    assert sc.post("/resleeve", {})[0] == 202
    wait_for(lambda: len(listed(sc)) == 2 and listed(sc)[0]["ended"], 15)
    tmux = ["tmux", "-S", str(sc.state_dir / "tmux.sock")]
    server = subprocess.run([*tmux, "display", "-p", "#{pid}"], capture_output=True, text=True)
    os.kill(int(server.stdout), 9)
    wait_for(lambda: len(listed(sc)) == 3 and listed(sc)[1]["ended"], 30, what="a healed run")
    first, second, third = listed(sc)
    assert third["ended"] is None
    assert markers(file_of(sc, first))[-2:] == ["resleeve: printer -> printer", "exited"]
    healed = markers(file_of(sc, second))
    assert any(m.startswith("error: tmux server") for m in healed), healed


def test_record_off_writes_nothing(printer: Callable[..., Sidecar]) -> None:
    sc = printer("say", "QUIET", SIDECAR_RECORD="off").start()
    shows(sc, "QUIET")
    assert listed(sc) == []
    assert not (sc.state_dir / "recordings").exists()


def served(sc: Sidecar, item: dict) -> list[Any]:
    """A recording's lines as the API serves them (a file being written: to its last whole
    line), decoded."""
    code, raw = sc.get(f"/recordings/{item['id']}")
    assert code == 200, raw
    return [json.loads(line) for line in raw.decode().splitlines()]


def test_a_run_is_recorded_at_the_screens_size_and_follows_a_resize(
    printer: Callable[..., Sidecar],
) -> None:
    """The header says the screen the run began on; PUT /screen/size is an `"r"` event, and
    a resleeve's new run begins at the new size."""
    sc = printer("say", "SIZED").start()
    shows(sc, "SIZED")
    [item] = listed(sc)
    header = served(sc, item)[0]
    assert (header["width"], header["height"]) == (200, 50)
    resize = {"cols": 100, "rows": 30}
    code, body = http("PUT", f"{sc.url}/screen/size", resize, headers=bearer(TOKEN))
    assert code == 200, body
    wait_for(
        lambda: ["r", "100x30"] in [event[1:] for event in served(sc, item)[1:]],
        15,
        what="the resize in the recording",
    )
    assert sc.post("/resleeve", {})[0] == 202
    wait_for(lambda: len(listed(sc)) == 2, 15, what="the resleeved run")
    header = served(sc, listed(sc)[1])[0]
    assert (header["width"], header["height"]) == (100, 30)
