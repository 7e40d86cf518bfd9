"""Bad input for the least-privilege settings: SIDECAR_USER, the token files, the state dir.
Each is refused with one line naming the variable (exit 2) by a real `sidecar run`, and the
pure parsers are tested directly. A FIFO or a device in place of a file never blocks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.config import Config, ConfigError
from sidecar.core import files
from sidecar.pane.tmux import WAITER_SCRIPT, env_file_text
from sidecar.process import statedir
from sidecar.security import caps, tokens
from sidecar.security.users import parse_user
from tests.commands import run_sidecar
from tests.harness import REPO
from tests.tools import SYSTEM_PYTHON, missing

BASE = {"SLEEVE_NAME": "alice", "SLEEVE_CLI": "shell"}
UID = GID = 23456  # no passwd entry


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# ---- SIDECAR_USER -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("no-such-user-x", "unknown user 'no-such-user-x'"),
        ("4294967295", "out of range"),
        ("99999999999999", "out of range"),
        ("0", "is root"),
        ("root", "is root"),
        ("1000:0", "is root"),
        ("1000:abc", "gid 'abc' must be a number"),
        ("1000:", "not a user name"),
        (":1000", "not a user name"),
        ("nobody:1000", "give a uid before ':'"),
    ],
)
def test_a_bad_sidecar_user_exits_2_naming_it(value: str, needle: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SIDECAR_USER") as info:
        Config.from_env({**BASE, "SIDECAR_USER": value}, euid=0)
    assert needle in str(info.value)
    line = one_line(run_sidecar({**BASE, "SIDECAR_USER": value}, tmp_path))
    assert line.startswith("sidecar: SIDECAR_USER") and needle in line


def test_sidecar_user_forms() -> None:
    bare = parse_user(f"{UID}")
    assert (bare.uid, bare.gid, bare.groups, bare.name, bare.home) == (UID, GID, (), None, None)
    assert parse_user(f"{UID}:777").gid == 777
    nobody = parse_user("nobody")
    assert nobody.uid == 65534 and nobody.name == "nobody"
    assert parse_user("65534").name == "nobody"  # a uid with an entry gets its name
    assert nobody.home is None  # /nonexistent: the CLI's HOME falls back to the workspace
    cfg = Config.from_env({**BASE, "SIDECAR_USER": "nobody"}, euid=0)
    assert cfg.cli_home == cfg.workspace
    assert cfg.paths.session_dir == cfg.state_dir / "session"
    assert cfg.paths.tmux_socket == cfg.state_dir / "session" / "tmux.sock"
    home = Config.from_env({**BASE, "SIDECAR_USER": "nobody", "SIDECAR_USER_HOME": "/h"}, euid=0)
    assert home.cli_home == Path("/h")


def test_sidecar_user_set_while_not_root_exits_2_unless_it_is_that_very_uid() -> None:
    with pytest.raises(ConfigError, match="needs the sidecar to start as root"):
        Config.from_env({**BASE, "SIDECAR_USER": "1234"}, euid=1000)
    assert Config.from_env({**BASE, "SIDECAR_USER": "1000"}, euid=1000).user is None


def test_sidecar_user_as_a_non_root_process_exits_2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("running the sidecar as another uid needs root")
    tmp_path.chmod(0o777)
    line = one_line(
        run_sidecar(
            {**BASE, "SIDECAR_USER": "4321"},
            tmp_path,
            python=SYSTEM_PYTHON,
            user=UID,
            group=GID,
            cwd="/",
        )
    )
    assert f"runs as uid {UID}" in line and "start as root" in line


def test_sidecar_user_without_the_capabilities_to_switch_exits_2_naming_them(
    tmp_path: Path,
) -> None:
    """Root under `docker run --cap-drop ALL` cannot switch users: say which --cap-add."""
    if os.geteuid() != 0:
        missing("dropping capabilities from a root process needs root")
    setpriv = ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--")
    line = one_line(
        run_sidecar({**BASE, "SIDECAR_USER": f"{UID}:{GID}"}, tmp_path, argv_prefix=setpriv)
    )
    assert "--cap-add SETUID" in line and "--cap-add SETGID" in line and "--cap-add KILL" in line


def test_keep_only_leaves_exactly_those_capabilities() -> None:
    if os.geteuid() != 0:
        missing("capabilities to drop need root")
    code = (
        "import json; from sidecar.security import caps; caps.keep_only(caps.NEEDED_CAPS); "
        "kinds = ('CapEff', 'CapPrm', 'CapBnd', 'CapInh', 'CapAmb'); "
        "print(json.dumps([sorted(caps.current_caps(k)) for k in kinds]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    ).stdout
    kept = sorted(caps.NEEDED_CAPS)
    assert json.loads(out) == [kept, kept, kept, [], []]


# ---- token files ------------------------------------------------------------------------------


def test_token_files_strip_one_newline_and_follow_symlinks(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("tok-1\n")
    assert tokens.read_token_file("SIDECAR_TOKEN_FILE", str(tmp_path / "t")) == "tok-1"
    (tmp_path / "crlf").write_bytes(b"tok-2\r\n")
    assert tokens.read_token_file("X", str(tmp_path / "crlf")) == "tok-2"
    (tmp_path / "link").symlink_to(tmp_path / "t")  # Kubernetes mounts keys as symlinks
    assert tokens.read_token_file("X", str(tmp_path / "link")) == "tok-1"
    cfg = Config.from_env({**BASE, "SIDECAR_VIEW_TOKEN_FILE": str(tmp_path / "t")})
    assert cfg.view_token == "tok-1" and cfg.token is None


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def _bad_token_file(kind: str, tmp: Path) -> Path:
    contents = {
        "empty": b"",
        "newline only": b"\n",
        "1 MiB": b"x" * (1 << 20),
        "two lines": b"a\nb\n",
    }
    if kind in contents:
        (tmp / "token").write_bytes(contents[kind])
        return tmp / "token"
    return {
        "missing": tmp / "missing",
        "directory": tmp,
        "fifo": _fifo(tmp) if kind == "fifo" else tmp,
        "device": Path("/dev/zero"),
    }[kind]


@pytest.mark.parametrize(
    ("kind", "needle"),
    [
        ("missing", "does not exist"),
        ("directory", "is a directory"),
        ("empty", "is empty"),
        ("newline only", "is empty"),
        ("1 MiB", "larger than"),
        ("two lines", "line breaks"),
        ("fifo", "not a regular file"),
        ("device", "not a regular file"),
    ],
)
def test_a_bad_token_file_exits_2_at_once(tmp_path: Path, kind: str, needle: str) -> None:
    path = _bad_token_file(kind, tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="SIDECAR_TOKEN_FILE") as info:
        Config.from_env({**BASE, "SIDECAR_TOKEN_FILE": str(path)})
    assert needle in str(info.value)
    line = one_line(run_sidecar({**BASE, "SIDECAR_TOKEN_FILE": str(path)}, tmp_path))
    assert line.startswith("sidecar: SIDECAR_TOKEN_FILE") and needle in line
    assert time.monotonic() - started < 10  # a FIFO with no writer is never waited on


def test_an_unreadable_token_file_exits_2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("a file this process cannot read needs another uid to run the sidecar")
    secret = tmp_path / "token"
    secret.write_text("tok\n")
    secret.chmod(0o600)
    tmp_path.chmod(0o777)
    result = run_sidecar(
        {**BASE, "SIDECAR_VIEW_TOKEN_FILE": str(secret)},
        tmp_path,
        python=SYSTEM_PYTHON,
        user=UID,
        group=GID,
        cwd="/",
    )
    line = one_line(result)
    assert "SIDECAR_VIEW_TOKEN_FILE" in line and "Permission denied" in line


@pytest.mark.parametrize("var", ["SIDECAR_TOKEN", "SIDECAR_VIEW_TOKEN"])
def test_a_token_and_its_file_together_exit_2(var: str, tmp_path: Path) -> None:
    (tmp_path / "t").write_text("from-file\n")
    env = {var: "from-env", f"{var}_FILE": str(tmp_path / "t")}
    with pytest.raises(ConfigError, match=f"{var} and {var}_FILE are both set"):
        Config.from_env({**BASE, **env})
    # Through the re-exec that moves the environment's token into a memfd, too.
    assert f"{var} and {var}_FILE are both set" in one_line(run_sidecar({**BASE, **env}, tmp_path))


# ---- the state dir ----------------------------------------------------------------------------


def test_an_existing_state_dir_is_used_as_it_is(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    state.chmod(0o750)
    cfg = Config.from_env({**BASE, "SIDECAR_STATE_DIR": str(state)})
    statedir.prepare(cfg)
    assert stat.S_IMODE(state.stat().st_mode) == 0o750
    made = Config.from_env({**BASE, "SIDECAR_STATE_DIR": str(tmp_path / "new" / "state")})
    statedir.prepare(made)
    assert stat.S_IMODE(made.state_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("mode", "owner", "needle"),
    [
        (0o777, None, "every user can write it"),
        (0o1777, None, "every user can write it"),
        (0o770, (0, 4242), "group 4242 can write it"),
        (0o700, (4242, 4242), "it belongs to uid 4242"),
    ],
)
def test_a_state_dir_others_can_write_exits_2(
    tmp_path: Path, mode: int, owner: tuple[int, int] | None, needle: str
) -> None:
    if owner is not None and os.geteuid() != 0:
        missing("giving the state dir to another uid needs root")
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    if owner is not None:
        os.chown(state, *owner)
    line = one_line(run_sidecar({**BASE, "SIDECAR_STATE_DIR": str(state)}, tmp_path))
    assert line.startswith("sidecar: SIDECAR_STATE_DIR") and needle in line


def test_with_sidecar_user_a_state_dir_the_user_cannot_reach_exits_2(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        missing("SIDECAR_USER needs root")
    tmp_path.chmod(0o700)  # pytest's temp dirs: the user cannot pass
    line = one_line(run_sidecar({**BASE, "SIDECAR_USER": f"{UID}:{GID}"}, tmp_path))
    assert "cannot reach" in line and "x for that user" in line


# ---- files another user controls ------------------------------------------------------------


def test_read_regular_never_follows_a_symlink_nor_blocks_on_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("3\n")
    assert files.read_regular(tmp_path / "real") == b"3\n"
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert files.read_regular(tmp_path / "link") is None
    assert files.read_regular(_fifo(tmp_path)) is None
    assert files.read_regular(Path("/dev/zero")) is None


def test_write_new_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "cli.env").symlink_to(victim)
    files.write_new(tmp_path / "cli.env", b"A=1\n", 0o640)
    assert victim.read_text() == "keep"
    assert (tmp_path / "cli.env").read_text() == "A=1\n"
    assert stat.S_IMODE((tmp_path / "cli.env").lstat().st_mode) == 0o640


@pytest.mark.parametrize(
    "value", ["", "plain", "a\\nb", "two\nlines", "x\\\\y", "\\c stop", "-n", "$HOME `id` $(id)"]
)
def test_the_pane_waiter_exports_registry_values_byte_for_byte(tmp_path: Path, value: str) -> None:
    env_file = tmp_path / "cli.env"
    env_file.write_text(env_file_text({"V": value, "W": "second"}))
    dump = "import os, sys; sys.stdout.write(os.environ['V'] + '|' + os.environ['W'])"
    python = [sys.executable, "-c", dump]
    out = subprocess.run(
        ["sh", "-c", WAITER_SCRIPT, "w", str(tmp_path / "st"), str(env_file), *python],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == f"{value}|second"
    assert (tmp_path / "st").read_text() == "0\n"
