"""The files outside the state dir that hold credentials (`Config.credential_files`: the API
tokens', the notification secrets', the secrets file) are out of the agent's reach. One-uid
mode (the restricted pod: the sidecar, and the CLI, as one unprivileged uid that owns them):
the egress fence keeps the CLI from reading or changing them, while the same uid outside the
guard reads them all. SIDECAR_USER: a start where that user could read one is refused (exit 2)
naming its variable."""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from sidecar.config import Config, ConfigError, trusted
from sidecar.security.users import parse_user
from tests.commands import run_sidecar
from tests.harness import Sidecar, bearer, wait_for, write_cli_config
from tests.oneuid import ONE_UID, OPEN_PYTHON, UID
from tests.redteam.guardtools import NOBODY, run_as

REWRITES = Path(__file__).resolve().parent / "rewrites.py"
SECRET = {"name": "api", "env": "API_KEY", "from_env": "API_VALUE", "hosts": ["localhost"]}
# The variables of a credential file, and the file's name in the test's directory.
FILES = {
    "SIDECAR_TOKEN_FILE": "token",
    "SIDECAR_VIEW_TOKEN_FILE": "view-token",
    "SIDECAR_NOTIFY_NTFY_TOKEN_FILE": "ntfy-token",
    "SIDECAR_SECRETS_FILE": "secrets.yaml",
}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the CLI as other uids")


def credentials(folder: Path, uid: int) -> dict[str, str]:
    """The credential files in `folder` (a directory of their own, as /run/secrets is), 0600
    and `uid`'s, with a file beside them that holds none; the variables naming them."""
    folder.mkdir(mode=0o700)
    for name in ("token", "view-token", "ntfy-token"):
        (folder / name).write_text(f"{name}-{secrets.token_hex(16)}\n")
    (folder / "secrets.yaml").write_text(yaml.safe_dump({"secrets": [SECRET]}))
    (folder / "plain.txt").write_text("nothing secret\n")
    for path in [folder, *folder.iterdir()]:
        os.chown(path, uid, uid)
        path.chmod(0o700 if path.is_dir() else 0o600)
    return {var: str(folder / name) for var, name in FILES.items()}


def test_a_one_uid_cli_reads_no_credential_file_the_sidecar_read(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """The whole sleeve as one unprivileged uid: the sidecar read its token files at start
    (the API answers to those tokens), yet the guarded CLI gets EACCES opening or changing
    each credential file, and reads the file beside them; that uid unguarded reads them all,
    so the refusal is the fence's, not ownership's."""
    sc = make_sidecar(cli="rewrites")
    for path in (sc.tmp.parent, sc.tmp):
        path.chmod(0o755)  # the guard lists them as the CLI to fence the state dir
    os.chown(sc.tmp, UID, UID)
    files = credentials(sc.tmp / "creds", UID)
    plain = str(sc.tmp / "creds" / "plain.txt")
    against = [[op, files[var]] for var in FILES for op in ("read", "append")]
    own = [["read", plain], ["create", str(sc.workspace / "mine")]]
    report = sc.workspace / "report.json"
    command = [sys.executable, str(REWRITES), json.dumps(against + own), str(report)]
    config = write_cli_config(sc.tmp / "clis.yaml", {"rewrites": {"command": command}})
    os.chown(config, UID, UID)
    sc.workspace.mkdir()
    os.chown(sc.workspace, UID, UID)
    sc.wrapper = [*OPEN_PYTHON, *ONE_UID]
    sc.env_extra.update(
        files,
        SIDECAR_CLI_CONFIG=str(config),
        SIDECAR_EGRESS_ALLOW="localhost:1",  # the guard, and with it the fence
        API_VALUE="a-real-value-of-the-api",
    )
    sc.start(wait_healthy=False)
    got = wait_for(
        lambda: json.loads(report.read_text()) if report.exists() else None,
        timeout=60,
        what=f"the CLI's report (log: {sc.log_path})",
    )
    assert got == {" ".join(op): "EACCES" for op in against} | {" ".join(op): "ok" for op in own}
    for var in ("SIDECAR_TOKEN_FILE", "SIDECAR_VIEW_TOKEN_FILE"):
        token = Path(files[var]).read_text().strip()
        assert sc.get("/status", headers=bearer(token))[0] == 200
    assert sc.get("/status", headers={})[0] == 401
    free = run_as(UID, [sys.executable, str(REWRITES), json.dumps(against[::2])])
    assert free.returncode == 0, free.stderr
    assert set(json.loads(free.stdout).values()) == {"ok"}
    assert sc.stop() == 0


def test_with_sidecar_user_a_credential_file_that_user_can_read_stops_the_start(
    shared: Path,
) -> None:
    """The real start (exit 2, one line naming the variable) for a view token file left
    0644: the CLI's user would read it, drive the API and watch the terminal."""
    folder = shared / "creds"
    folder.mkdir()
    view = folder / "view-token"
    view.write_text("a-view-token-of-the-sleeve\n")
    view.chmod(0o644)
    user = f"{NOBODY}:{NOBODY}"
    env = {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "SIDECAR_USER": user}
    done = run_sidecar({**env, "SIDECAR_VIEW_TOKEN_FILE": str(view)}, shared)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"sidecar: SIDECAR_VIEW_TOKEN_FILE: {view} holds a credential the CLI's user "
        f"{parse_user(user).spec} can read: {view} lets it read (mode 0644, owner 0:0). "
        "Make it root's and 0600 (or 0400)"
    ]


@pytest.mark.parametrize("var", FILES)
def test_with_sidecar_user_each_credential_file_is_checked(shared: Path, var: str) -> None:
    """Each credential file is listed once under its variable, and each is refused when the
    CLI's user can read it by its mode or owns it; root's 0600 passes."""
    files = credentials(shared / "creds", 0)
    env = {"SLEEVE_NAME": "a", "SLEEVE_CLI": "shell", "API_VALUE": "a-real-value-of-the-api"}
    env |= {"SIDECAR_USER": f"{NOBODY}:{NOBODY}", "SIDECAR_EGRESS_ALLOW": "localhost:1"}
    config = Config.from_env({**env, **files, "SIDECAR_WORKSPACE": str(shared / "ws")})
    assert [name for name, _ in config.credential_files] == list(FILES)
    trusted.check(config)
    path = Path(files[var])
    for mode, owner in ((0o604, 0), (0o600, NOBODY)):
        path.chmod(mode)
        os.chown(path, owner, owner)
        with pytest.raises(ConfigError, match=f"^{var}: {path} ") as caught:
            trusted.check(config)
        assert str(caught.value).endswith(("(or 0400)", "not writable by that user"))
