"""Slots: ClaudeBox-compatible ids (checked against the real `cksum`), counter, reuse, locking."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.core.proc import start_time
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.slots import (
    COUNTER_FILE,
    RECOUNT_LIMIT,
    Project,
    cksum,
    slot_chain,
    slugify,
)
from sidecar.launcher.state import RUNNING, Run, StateStore

from .helpers import CLAUDEBOX_ID_FUNCTIONS, LIVES_UNTIL_KILLED, REPO, SLEEVE, Result


def real_cksum(data: bytes) -> int:
    out = subprocess.run(["cksum"], input=data, capture_output=True, check=True)
    return int(out.stdout.split()[0])


def random_path(rng: random.Random) -> str:
    alphabet = "abcXYZ019 _-.'\"$()`;&|*?!~#é漢字🙂\n\\"
    parts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3)]
    return "/" + "/".join(parts)


def test_cksum_equals_the_cksum_program_for_edge_lengths() -> None:
    # 0 bytes, one length byte, two, three (the length is appended only as wide as needed).
    for data in (b"", b"a", b"x" * 255, b"y" * 256, b"z" * 70_000, bytes(range(256))):
        assert cksum(data) == real_cksum(data)


def test_slot_ids_0_to_20_equal_the_cksum_chain_on_random_paths() -> None:
    rng = random.Random(20261122)
    for _ in range(6):
        path = random_path(rng)
        ours = slot_chain(Path(path), 20)
        value = real_cksum(path.encode())
        expected = [f"{value:08x}"]
        for _ in range(20):
            value = real_cksum(str(value).encode())  # ClaudeBox: cksum of the decimal text
            expected.append(f"{value:08x}")
        assert ours == expected, path


def test_slot_ids_equal_claudebox_bash_functions() -> None:
    """ClaudeBox's own shell code (crc32_string/crc32_word/generate_container_name)."""
    path = "/tmp/a b/'q'/$(x)/é"
    script = (
        CLAUDEBOX_ID_FUNCTIONS
        + 'for n in 0 1 2 3 4 5; do generate_container_name "$P" "$n"; done\n'
    )
    out = subprocess.run(
        ["bash", "-c", script], env={**os.environ, "P": path}, capture_output=True, text=True
    )
    assert out.stdout.split() == slot_chain(Path(path), 5)


def test_slug_is_claudeboxs_lowercased_underscore_form() -> None:
    assert slugify(Path("/Home/me/My Project-2.0")) == "home_me_my_project_2_0"


def test_project_dir_and_container_name_follow_the_contract(tmp_path: Path) -> None:
    proj = Project(Path("/srv/App"), tmp_path)
    crc0, crc3 = slot_chain(proj.root, 3)[0], slot_chain(proj.root, 3)[3]
    assert proj.dir == tmp_path / "projects" / f"srv_app_{crc0}"
    assert proj.container_name(crc3) == f"sleeve-srv_app_{crc0}-{crc3}"


def counter(proj: Project) -> int:
    return int((proj.dir / COUNTER_FILE).read_text())


def test_create_starts_at_slot_1_and_counts_up(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    for n in (1, 2, 3):
        res = sleeve("create", "--project", project, "--json")
        assert res.code == 0, res.err
        assert json.loads(res.out)["index"] == n
    proj = Project(project.resolve(), home)
    assert counter(proj) == 3
    assert (proj.slot_path(2) / ".claude").is_dir()
    assert (proj.dir / "profiles.ini").exists()
    assert (proj.dir / ".project_path").read_text() == f"{project.resolve()}\n"


def test_create_reuses_a_slot_deleted_by_hand(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    for _ in range(3):
        sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    shutil.rmtree(proj.slot_path(2))
    listing = json.loads(sleeve("slots", "--project", project, "--json").out)["slots"]
    assert [s["state"] for s in listing] == ["unauthenticated", "dead", "unauthenticated"]
    res = sleeve("create", "--project", project, "--json")
    assert json.loads(res.out)["index"] == 2
    assert counter(proj) == 3


def test_slots_prunes_counter_5_with_slots_4_and_5_deleted_to_3(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    for _ in range(5):
        sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    shutil.rmtree(proj.slot_path(4))
    shutil.rmtree(proj.slot_path(5))
    listing = json.loads(sleeve("slots", "--project", project, "--json").out)["slots"]
    assert [s["index"] for s in listing] == [1, 2, 3]
    assert counter(proj) == 3
    assert json.loads(sleeve("create", "--project", project, "--json").out)["index"] == 4


def test_slots_shows_authenticated_unauthenticated_and_dead(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    for _ in range(3):
        sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    (proj.slot_path(1) / ".claude" / ".credentials.json").write_text("{}")
    shutil.rmtree(proj.slot_path(2))
    table = sleeve("slots", "--project", project).out
    lines = [line.split() for line in table.splitlines()[2:]]
    assert [(row[0], row[1]) for row in lines] == [
        ("1", slot_chain(proj.root, 1)[1]),
        ("2", slot_chain(proj.root, 2)[2]),
        ("3", slot_chain(proj.root, 3)[3]),
    ]
    assert "authenticated" in lines[0] and "dead" in lines[1] and "unauthenticated" in lines[2]


def test_twenty_parallel_creates_give_twenty_distinct_slots(
    home: Path, project: Path, env: dict[str, str]
) -> None:
    procs = [
        subprocess.Popen(
            [*SLEEVE, "create", "--project", str(project), "--json"],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(20)
    ]
    indexes = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        indexes.append(json.loads(out)["index"])
    assert sorted(indexes) == list(range(1, 21))
    proj = Project(project.resolve(), home)
    assert counter(proj) == 20
    assert len([p for p in proj.dir.iterdir() if p.is_dir()]) == 20


@pytest.mark.parametrize("content", ["", "garbage\n", "-4", "\xff"])
def test_corrupt_or_missing_counter_is_recomputed_with_a_warning(
    home: Path,
    project: Path,
    sleeve: Callable[..., Result],
    content: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for _ in range(4):
        sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    shutil.rmtree(proj.slot_path(2))
    if content:
        (proj.dir / COUNTER_FILE).write_text(content, errors="surrogateescape")
    else:
        (proj.dir / COUNTER_FILE).unlink()
    res = sleeve("slots", "--project", project, "--json")
    assert res.code == 0
    assert [s["index"] for s in json.loads(res.out)["slots"]] == [1, 2, 3, 4]
    assert counter(proj) == 4
    assert "recomputed 4" in caplog.text


def test_rm_deletes_the_slot_and_refuses_unknown_or_dead_ones(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    sleeve("create", "--project", project)
    sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    assert sleeve("rm", "2", "--project", project).code == 0
    assert not proj.slot_path(2).exists()
    res = sleeve("rm", "2", "--project", project)
    assert res.code == 1 and "already dead" in res.err
    res = sleeve("rm", "7", "--project", project)
    assert res.code == 1 and "no slot 7" in res.err


def test_slots_of_a_project_without_slots_says_how_to_create_one(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    res = sleeve("slots", "--project", project)
    assert res.code == 0 and "`sleeve create`" in res.out
    assert not home.exists()  # a listing creates nothing


def test_slots_for_100_slots_takes_under_a_tenth_of_a_second(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    proj = Project(project.resolve(), home)
    proj.ensure()
    for slot_id in slot_chain(proj.root, 100)[1:]:
        (proj.dir / slot_id / ".claude").mkdir(parents=True)
    (proj.dir / COUNTER_FILE).write_text("100")
    timings = []
    for _ in range(3):  # best of three: other work on a shared test machine only adds time
        start = time.perf_counter()
        res = sleeve("slots", "--project", project, "--json")
        timings.append(time.perf_counter() - start)
        assert len(json.loads(res.out)["slots"]) == 100
    assert min(timings) < 0.1, timings


def test_rm_refuses_a_running_slot_unless_forced_which_stops_it_first(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """The run's recorded process is a real child standing in for the bwrap waiter: `--force`
    must SIGTERM it (verified by pid and start time) before the directory goes."""
    sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    child = subprocess.Popen(LIVES_UNTIL_KILLED)
    try:
        start = start_time(child.pid)
        run = Run("r1", proj.key, 1, proj.slot_path(1).name, "bwrap", "shell", pid=child.pid)
        run.pid_start, run.status = start, RUNNING
        StateStore(home).upsert(run)
        res = sleeve("rm", "1", "--project", project)
        assert res.code == 1 and "slot 1 is running" in res.err and "--force" in res.err
        assert proj.slot_path(1).is_dir()
        res = sleeve("rm", "1", "--project", project, "--force")
        assert res.code == 0, res.err
        assert child.wait(timeout=10) == -signal.SIGTERM
        assert not proj.slot_path(1).exists()
        assert [r.status for r in StateStore(home).read()] == ["stopped"]
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("command", ["slots", "create"])
@pytest.mark.parametrize("content", ["4000000000", str(RECOUNT_LIMIT + 1)])
def test_a_counter_beyond_the_recount_limit_is_corrupt_and_recomputed(
    home: Path, project: Path, sleeve_proc: Callable[..., Result], command: str, content: str
) -> None:
    """A real process with a deadline: before the fix this built a 4e9-long id chain."""
    for _ in range(3):
        assert sleeve_proc("create", "--project", project).code == 0
    proj = Project(project.resolve(), home)
    (proj.dir / COUNTER_FILE).write_text(content)
    res = sleeve_proc(command, "--project", project, "--json", timeout=30)
    assert res.code == 0, res.err
    assert "was corrupt; recomputed 3" in res.err
    assert counter(proj) == (3 if command == "slots" else 4)


def test_create_refuses_a_slot_beyond_the_recount_limit(
    home: Path, project: Path, sleeve: Callable[..., Result]
) -> None:
    """The counter never goes where read_counter would call it corrupt."""
    sleeve("create", "--project", project)
    proj = Project(project.resolve(), home)
    for slot_id in slot_chain(proj.root, RECOUNT_LIMIT)[2:]:
        # About one root in a hundred has a chain that repeats an id within the limit.
        (proj.dir / slot_id).mkdir(exist_ok=True)
    (proj.dir / COUNTER_FILE).write_text(str(RECOUNT_LIMIT))
    res = sleeve("create", "--project", project)
    assert res.code == 1 and f"already has {RECOUNT_LIMIT} slots" in res.err
    assert counter(proj) == RECOUNT_LIMIT


def test_create_refuses_a_slot_whose_id_the_chain_repeats(home: Path) -> None:
    """/srv/p150's chain gives slot 5580 the id of slot 994, and repeats from there on."""
    proj = Project(Path("/srv/p150"), home)  # never read: only its name makes the ids
    ids = slot_chain(proj.root, 5580)
    assert ids[5580] == ids[994] and len(set(ids[1:5580])) == 5579
    proj.ensure()
    for slot_id in ids[1:5580]:
        (proj.dir / slot_id).mkdir()
    (proj.dir / COUNTER_FILE).write_text("5579")
    with pytest.raises(LauncherError, match="already has 5579 slots"):
        proj.create()
    assert counter(proj) == 5579
    assert len(proj.slots()) == 5579
