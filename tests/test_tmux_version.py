"""Which tmux runs: the suite's own (scripts/build-tmux: 3.5a with our patch, which keeps its
server alive where 3.5a's dies), and a sidecar that finds a tmux older than 3.4 on PATH warns in
/status and runs all the same (docs/tmux.md).

Real tmux binaries: the one scripts/setup built, and Debian 12's 3.3a package as the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import termios
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sidecar.pane.tmux_version import parse, warning
from tests.harness import Sidecar, wait_for
from tests.tools import TMUX_BIN, missing, require_executable

OLD_TMUX = Path("/usr/bin/tmux")  # Debian 12's package: 3.3a


@pytest.mark.parametrize(
    ("answer", "version"),
    [
        ("tmux 3.5a", (3, 5)),
        ("tmux 3.3a\n", (3, 3)),
        ("tmux 3.4", (3, 4)),
        ("tmux 2.9a", (2, 9)),
        ("tmux 10.0", (10, 0)),
        ("tmux next-3.6", (3, 6)),
        ("tmux master", None),
        ("tmux openbsd-7.6", None),
        ("", None),
        ("something else 3.3", None),
    ],
)
def test_tmux_versions_are_read_from_its_answer(
    answer: str, version: tuple[int, int] | None
) -> None:
    assert parse(answer) == version


def test_only_a_release_older_than_3_4_is_warned_about() -> None:
    assert warning("tmux 3.3a") is not None
    assert warning("tmux 3.3a").startswith("tmux 3.3a is older than 3.4")  # type: ignore[union-attr]
    assert warning("tmux 2.9a") is not None
    for fine in ("tmux 3.4", "tmux 3.5a", "tmux next-3.6", "tmux master", "", None):
        assert warning(fine) is None, fine


def version_of(binary: str | Path) -> tuple[int, int] | None:
    answer = subprocess.run([str(binary), "-V"], capture_output=True, text=True, check=True)
    return parse(answer.stdout)


def test_the_suite_runs_the_tmux_scripts_setup_built() -> None:
    """tests/conftest.py puts it first on PATH; without it (in CI: a failure) every test runs
    whatever tmux the machine has, which may be the 3.3a that crashes."""
    if not (TMUX_BIN / "tmux").exists():
        missing(f"tmux 3.5a is not built at {TMUX_BIN} (scripts/setup builds it)")
    assert require_executable("tmux") == str(TMUX_BIN / "tmux")
    found = version_of("tmux")
    assert found is not None and found >= (3, 5), found
    # With our patch (scripts/build-tmux): a drawing a smaller client cannot show is skipped,
    # where tmux 3.5a's server exits ("fatal: tty_clamp_area: x too big"; the torture test with
    # TORTURE_SEED=1255171888 hit it in 3 of 15 runs). Its log message is the patch's mark.
    built = (TMUX_BIN / "tmux").read_bytes()
    assert b"too big, %u > %u; not drawn" in built
    assert b"respawned, its offsets start afresh" in built  # the respawn's, below


@pytest.fixture
def suite_tmux(short_tmp: Path) -> Iterator[list[str]]:
    """The suite's tmux on a private socket, no configuration; its server killed after."""
    if not (TMUX_BIN / "tmux").exists():
        missing(f"tmux 3.5a is not built at {TMUX_BIN} (scripts/setup builds it)")
    tmux = [str(TMUX_BIN / "tmux"), "-S", str(short_tmp / "tmux.sock"), "-f", "/dev/null"]
    yield tmux
    subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)


def test_a_respawn_under_a_control_client_that_is_behind_keeps_the_server(
    suite_tmux: list[str],
) -> None:
    """tmux 3.5a and 3.6a keep a pane's offsets into its old output across a respawn (GitHub
    issue 5499): with a control client behind on the pane, the server then parses the new
    output with a length below zero and dies (SIGSEGV; this test on 3.5a unpatched: 6 runs of
    6). Our patch starts the offsets afresh: the new output is drawn, the server lives, and the
    client, once it reads again, gets the new output."""
    flood = "while :; do printf '%0700d\\n' 0; sleep 0.01; done"
    # Its history never full while the test runs: it counts the pane's output below.
    start = [*suite_tmux, "start-server", ";", "set", "-g", "history-limit", "1000000", ";"]
    subprocess.run(
        [*start, "new-session", "-d", "-s", "a", "-x", "80", "-y", "24", flood], check=True
    )
    pid = int(subprocess.check_output([*suite_tmux, "display", "-p", "#{pid}"], text=True))
    client = subprocess.Popen(
        [*suite_tmux, "-C", "attach", "-t", "a"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        out = client.stdout
        assert out is not None
        # Not read: its pipe fills, and then the server keeps the pane's output for it. Full:
        # what the pipe holds stays the same while the pane writes 20 lines more.
        fd = out.fileno()

        def written() -> int:
            answer = [*suite_tmux, "display", "-p", "-t", "a:0", "#{history_size}"]
            return int(subprocess.check_output(answer, text=True))

        last = (-1, 0)

        def full() -> bool:
            nonlocal last
            queued = int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, bytes(4)), "little")
            lines = written()
            if queued != last[0]:
                last = (queued, lines)
            return queued > 0 and lines - last[1] >= 20

        wait_for(full, 20, what="the control client's pipe full")
        # The pane goes on writing: the client is behind on it now, whatever else happens.
        mark = "respawned-and-drawn"
        subprocess.run(
            [*suite_tmux, "respawn-pane", "-k", "-t", "a:0", f"printf {mark}; exec sleep 600"],
            check=True,
        )

        def drawn() -> bool:
            capture = [*suite_tmux, "capture-pane", "-p", "-t", "a:0"]
            shown = subprocess.run(capture, capture_output=True, text=True, check=False)
            assert shown.returncode == 0, f"the tmux server died: {shown.stderr.strip()}"
            return mark in shown.stdout

        wait_for(drawn, 20, what="the respawned pane's output drawn")
        os.kill(pid, 0)  # the server lives (ProcessLookupError: it died)
        seen = threading.Event()

        def read() -> None:
            for line in out:
                if mark.encode() in line:
                    seen.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        assert seen.wait(20), "the control client never got the respawned pane's output"
    finally:
        client.kill()
        client.wait()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # a server waiting to flush to a gone client
        for pipe in (client.stdin, client.stdout):
            if pipe is not None:
                pipe.close()  # the reader, if still reading, has its end once the server is gone


def test_a_tmux_older_than_3_4_is_warned_about_and_runs(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    """The old tmux first on the sidecar's PATH: /status warns once, naming the version, and
    the CLI runs in it."""
    if not OLD_TMUX.exists() or (version_of(OLD_TMUX) or (0, 0)) >= (3, 4):
        missing(f"no tmux older than 3.4 at {OLD_TMUX} (Debian 12's package: apt-get install tmux)")
    old_bin = short_tmp / "old-tmux"
    old_bin.mkdir()
    (old_bin / "tmux").symlink_to(OLD_TMUX)
    sc = make_sidecar(env_extra={"PATH": f"{old_bin}:/usr/bin:/bin"}).start()
    status = sc.status()
    assert status["cli_running"]
    tmux_warnings = [w for w in status["warnings"] if w.startswith("tmux ")]
    assert len(tmux_warnings) == 1, status["warnings"]
    assert tmux_warnings[0].startswith("tmux 3.3a is older than 3.4"), tmux_warnings
    code, body = sc.get("/screen")
    assert code == 200, body
