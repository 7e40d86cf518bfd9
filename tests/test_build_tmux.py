"""scripts/build-tmux stops with a clear message, and leaves nothing half-built behind, when it
cannot build: a missing build dependency is named before anything is fetched, and a source
that cannot be fetched leaves the cache as it was. (The build itself runs in scripts/setup;
tests/test_tmux_version.py checks its result.)

Each test runs a copy of the script in a scratch checkout, so that its `.cache` is the test's
own. PATH without bison is a directory of links to every other program of /usr/bin (the seam:
the machine's set of installed programs); the unreachable mirror is a closed loopback port.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sidecar.core.loopback import free_port
from tests.harness import REPO
from tests.tools import require_executable

SCRIPT = REPO / "scripts" / "build-tmux"


def checkout(tmp: Path) -> Path:
    (tmp / "scripts").mkdir()
    shutil.copy2(SCRIPT, tmp / "scripts" / "build-tmux")
    return tmp / "scripts" / "build-tmux"


def path_without(tmp: Path, *hidden: str) -> str:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for entry in os.scandir("/usr/bin"):
        if entry.name not in hidden:
            (bin_dir / entry.name).symlink_to(entry.path)
    return str(bin_dir)


def run(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_missing_build_dependency_is_named_and_nothing_is_built(tmp_path: Path) -> None:
    require_executable("bison")  # the package the test hides must be the one that was there
    script = checkout(tmp_path)
    env = {"PATH": path_without(tmp_path, "bison", "yacc", "byacc"), "HOME": str(tmp_path)}
    listed = subprocess.run(
        [str(script), "--missing"], env=env, capture_output=True, text=True, check=True
    )
    assert listed.stdout.split() == ["bison"]
    done = run(script, env)
    assert done.returncode == 1
    assert "missing Debian packages: bison" in done.stderr, done.stderr
    assert not (tmp_path / ".cache").exists()


def test_a_source_that_cannot_be_fetched_stops_the_build_and_leaves_no_trace(
    tmp_path: Path,
) -> None:
    script = checkout(tmp_path)
    mirror = f"http://127.0.0.1:{free_port()}/debian"  # nothing listens there
    # apt's own config file: no retries of a refused connection (each costs seconds of backoff)
    (tmp_path / "apt.conf").write_text('Acquire::Retries "0";\n')
    env = {**os.environ, "DEBIAN_MIRROR": mirror, "APT_CONFIG": str(tmp_path / "apt.conf")}
    done = run(script, env)
    assert done.returncode == 1, done.stderr
    assert f"apt could not fetch tmux 3.5a-3 from {mirror}" in done.stderr, done.stderr
    left = sorted(p.name for p in (tmp_path / ".cache").iterdir())
    assert left == ["tmux.lock"], left  # no build dir, no tree, no link
    assert subprocess.run([str(script), "--check"], env=env, check=False).returncode == 1
