"""`sleeve run --secret NAME=FILE[,env=VAR][,hosts=HOST;HOST]`: checked before anything starts,
written as the sidecar's secrets file, and the value handed in where only the sidecar reads it
(docker: a root-only file copied in; bwrap: the sidecar's own environment) and never in an
argv, a printed line or the launcher's state."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from sidecar.core.loopback import free_port
from sidecar.launcher import secretopts
from sidecar.launcher.bwrap import HostPython, bwrap_command
from sidecar.launcher.docker import docker_command
from sidecar.launcher.fsutil import LauncherError
from sidecar.launcher.plan import passthrough_env
from sidecar.launcher.secretopts import SecretArg
from tests.harness import wait_for

from .helpers import SECRET, Result
from .test_run_privileges import plan

VALUE = "sk-ant-api03-REALVALUE-0123456789abcdef"
GH_VALUE = "ghp_REALGITHUBTOKEN0123456789abcdef"


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "anthropic-key"
    path.write_text(VALUE + "\n")
    path.chmod(0o600)
    return path


def test_well_known_names_and_the_option_syntax(key: Path, tmp_path: Path) -> None:
    assert secretopts.parse(f"anthropic={key}") == SecretArg(
        "anthropic", "ANTHROPIC_API_KEY", ("api.anthropic.com",), str(key)
    )
    assert secretopts.parse("openai=f").env == "OPENAI_API_KEY"
    assert secretopts.parse("claude=f").env == "CLAUDE_CODE_OAUTH_TOKEN"
    assert secretopts.parse("gemini=f").hosts == ("generativelanguage.googleapis.com",)
    assert secretopts.parse("github=f").hosts == ("github.com", "api.github.com")
    own = secretopts.parse("corp=/k,env=CORP_KEY,hosts=api.corp.example; *.corp.example")
    assert (own.env, own.path) == ("CORP_KEY", "/k")
    assert own.hosts == ("api.corp.example", "*.corp.example")
    # A known name's defaults can be changed one by one; a comma may be part of the file name.
    assert secretopts.parse("anthropic=/a,b,env=MY_KEY").env == "MY_KEY"
    assert secretopts.parse("anthropic=/a,b,env=MY_KEY").path == "/a,b"
    assert secretopts.parse("anthropic=~/k").path == os.path.expanduser("~/k")
    (read,) = secretopts.parse_all([f"anthropic={key}"], ("api.anthropic.com",))
    assert read.value == VALUE  # one trailing newline stripped
    assert VALUE not in repr(read)
    assert read.from_env == "SLEEVE_SECRET_ANTHROPIC"


def _file(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


BAD: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "missing file": (lambda t: ["--secret", f"anthropic={t}/nope"], "does not exist"),
    "empty file": (lambda t: ["--secret", "anthropic=" + _file(t, "e", b"")], "is empty"),
    "a directory": (lambda t: ["--secret", f"anthropic={t}"], "is a directory"),
    "line break in the value": (
        lambda t: ["--secret", "anthropic=" + _file(t, "cr", b"sk-abc\r\nX-Evil: 1")],
        "must not contain control characters or line breaks",
    ),
    "over the size limit": (
        lambda t: ["--secret", "anthropic=" + _file(t, "big", b"k" * 70_000)],
        "is larger than",
    ),
    "too short to redact": (
        lambda t: ["--secret", "anthropic=" + _file(t, "short", b"abc\n")],
        "is too short; at least 8 characters",
    ),
    "not ASCII": (
        lambda t: ["--secret", "anthropic=" + _file(t, "utf8", "sk-clé-0123456789".encode())],
        "is not ASCII",
    ),
    "unknown name without env and hosts": (
        lambda t: ["--secret", "corp=/k"],
        "not a known name (anthropic, claude, openai, gemini, github); give env=VAR and hosts=",
    ),
    "no file": (lambda t: ["--secret", "anthropic"], "write NAME=FILE"),
    "bad option": (lambda t: ["--secret", "anthropic=/k,env=A,port=1"], "'port=1' is not"),
    "a port on a host": (lambda t: ["--secret", "corp=/k,env=C,hosts=a.example:8443"], "no port"),
    "a URL for a host": (
        lambda t: ["--secret", "corp=/k,env=C,hosts=https://a.example"],
        "no scheme",
    ),
    "same name twice": (
        lambda t: ["--secret", "github=/a", "--secret", "github=/b"],
        "--secret github is given twice",
    ),
    "same variable twice": (
        lambda t: [
            "--secret",
            "anthropic=/a",
            "--secret",
            "me=/b,env=ANTHROPIC_API_KEY,hosts=x.io",
        ],
        "--secret anthropic and --secret me both set ANTHROPIC_API_KEY",
    ),
    "open network": (
        lambda t: ["--egress", "open", "--secret", "anthropic=/a"],
        "needs an egress allowlist",
    ),
    "host not on the allowlist": (
        lambda t: ["--egress", _file(t, "allow", b"pypi.org\n"), "--secret", "anthropic=/a"],
        "host api.anthropic.com is not on the --egress allowlist",
    ),
}


@pytest.mark.parametrize(("args", "said"), list(BAD.values()), ids=list(BAD))
def test_a_bad_secret_is_one_clear_line_before_anything_is_made(
    args: Callable[[Path], list[str]],
    said: str,
    home: Path,
    project: Path,
    sleeve: Callable[..., Result],
) -> None:
    res = sleeve("run", "--project", project, "--runtime", "bwrap", *args(home.parent))
    assert res.code == 1
    assert res.err.startswith("sleeve: --secret"), res.err
    assert said in res.err and res.err.count("\n") == 1, res.err
    assert not home.exists(), "nothing is made for a run that cannot start"


def _secrets(*specs: str) -> tuple[SecretArg, ...]:
    return secretopts.parse_all(specs, ("api.anthropic.com", "github.com", "*.github.com"))


def test_bwrap_hands_values_in_the_sidecars_environment_and_the_file_names_no_value(
    key: Path, tmp_path: Path
) -> None:
    gh = tmp_path / "gh"
    gh.write_text(GH_VALUE)
    secrets = _secrets(f"anthropic={key}", f"github={gh}")
    host = {"ANTHROPIC_API_KEY": SECRET, "SLEEVE_SECRET_GITHUB": "from-the-host", "TERM": "x"}
    command = bwrap_command(
        plan(tmp_path, secrets=secrets, passthrough=passthrough_env(host, secrets)),
        HostPython.current(),
    )
    assert VALUE not in " ".join(command.argv) and GH_VALUE not in " ".join(command.argv)
    # The values: only in the sidecar's own variables (from_env), never the CLI's variable.
    assert command.env["SLEEVE_SECRET_ANTHROPIC"] == VALUE
    assert command.env["SLEEVE_SECRET_GITHUB"] == GH_VALUE
    assert "ANTHROPIC_API_KEY" not in command.env, "the host's real key is not passed"
    assert command.env["SIDECAR_SECRETS_FILE"] == "/run/sleeve/secrets.yaml"
    # The secrets file arrives on a pipe (bwrap's --ro-bind-data) and names no value.
    fd = command.argv[command.argv.index("/run/sleeve/secrets.yaml") - 1]
    data = command.fds[int(fd)].decode()
    assert VALUE not in data and GH_VALUE not in data
    assert json.loads(data) == {
        "secrets": [
            {
                "name": "anthropic",
                "env": "ANTHROPIC_API_KEY",
                "from_env": "SLEEVE_SECRET_ANTHROPIC",
                "hosts": ["api.anthropic.com"],
            },
            {
                "name": "github",
                "env": "GH_TOKEN",
                "from_env": "SLEEVE_SECRET_GITHUB",
                "hosts": ["github.com", "api.github.com"],
            },
        ]
    }
    assert command.argv[command.argv.index(fd) - 2] == "0400"


def test_docker_copies_root_only_files_in_and_no_value_reaches_docker_create(
    key: Path, tmp_path: Path
) -> None:
    secrets = _secrets(f"anthropic={key}")
    host = {"ANTHROPIC_API_KEY": SECRET}
    p = plan(
        tmp_path, user=(1001, 1002), secrets=secrets, passthrough=passthrough_env(host, secrets)
    )
    command = docker_command(p, host)
    create, copy, start = command.steps
    assert copy[:3] == ["docker", "cp", "-"] and start[:2] == ["docker", "start"]
    assert all(VALUE not in " ".join(step) for step in command.steps)
    assert "ANTHROPIC_API_KEY" not in create, "the host's real key is not passed by name"
    assert "SIDECAR_SECRETS_FILE=/run/sleeve/secrets.yaml" in create
    with tarfile.open(fileobj=io.BytesIO(command.stdin[1])) as tar:
        members = {m.name: (oct(m.mode), m.uid, m.isdir()) for m in tar.getmembers()}
        files = {m.name: tar.extractfile(m).read().decode() for m in tar if m.isfile()}  # type: ignore[union-attr]
    assert members["sleeve"] == members["sleeve/secrets"] == ("0o700", 0, True)
    assert (
        members["sleeve/secrets/anthropic"]
        == members["sleeve/secrets.yaml"]
        == (
            "0o600",
            0,
            False,
        )
    )
    assert files["sleeve/secrets/anthropic"] == VALUE
    (entry,) = json.loads(files["sleeve/secrets.yaml"])["secrets"]
    assert entry["file"] == "/run/sleeve/secrets/anthropic" and "from_env" not in entry


def test_docker_refuses_a_secret_when_the_cli_would_run_as_root(key: Path, tmp_path: Path) -> None:
    """Invoked as root, the docker runtime runs the CLI as root, which reads any file."""
    with pytest.raises(LauncherError, match="needs the CLI to run as a user other than root"):
        docker_command(plan(tmp_path, user=None, secrets=_secrets(f"anthropic={key}")), {})


def test_git_sends_the_github_placeholder_as_its_basic_password(tmp_path: Path) -> None:
    """The real git reads the credential configuration the launcher sets (no network: `git
    credential fill` only asks the helpers)."""
    gh = tmp_path / "gh"
    gh.write_text(GH_VALUE)
    env = secretopts.git_env(_secrets(f"github={gh}"))
    home = tmp_path / "home"
    home.mkdir()
    # A helper of the user's own that would answer first is cleared for github.com.
    (home / ".gitconfig").write_text("[credential]\n\thelper = !echo password=users-own #\n")
    run_env = {"PATH": os.environ["PATH"], "HOME": str(home), "GH_TOKEN": "placeholder-123"}
    out = subprocess.run(
        ["git", "credential", "fill"],
        input="protocol=https\nhost=github.com\n\n",
        env={**run_env, **env, "GIT_TERMINAL_PROMPT": "0"},
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    assert "username=x-access-token\n" in out and "password=placeholder-123\n" in out
    assert GH_VALUE not in json.dumps(env)


@pytest.mark.needs("bwrap")
def test_a_real_bwrap_sleeve_gets_the_file_and_its_sidecar_the_value_and_nothing_else_does(
    key: Path, home: Path, project: Path, sleeve_proc: Callable[..., Result]
) -> None:
    port = free_port()
    args = ("run", "--project", project, "--runtime", "bwrap", "--shell", "--port", str(port))
    res = sleeve_proc(*args, "--secret", f"anthropic={key}", "--wait", "40", timeout=90)
    try:
        assert res.code == 0, res.err
        assert VALUE not in res.out + res.err
        (run,) = json.loads(sleeve_proc("ps", "--json").out)
        waiter = psutil.Process(run["pid"])
        (bwrap,) = waiter.children()
        (init,) = wait_for(bwrap.children, what="the sandbox's PID 1")
        assert init.environ()["SIDECAR_SECRETS_FILE"] == "/run/sleeve/secrets.yaml"
        # The sidecar started (a from_env variable it lacks is an exit 2) and took the value
        # out of its own environment: no process in the sandbox holds it in its environ.
        for proc in (init, *init.children(recursive=True)):
            assert VALUE not in "\0".join(proc.environ().values()), proc
        inside = Path(f"/proc/{init.pid}/root/run/sleeve/secrets.yaml")
        assert oct(inside.stat().st_mode & 0o777) == "0o400"
        assert json.loads(inside.read_text())["secrets"][0]["from_env"] == "SLEEVE_SECRET_ANTHROPIC"
        # No argv on the machine, and nothing the launcher keeps, holds the value.
        for proc in psutil.process_iter(["cmdline"]):
            assert VALUE not in " ".join(proc.info["cmdline"] or []), proc
        for path in home.rglob("*"):
            if path.is_file():
                assert VALUE.encode() not in path.read_bytes(), path
    finally:
        sleeve_proc("stop", "1", "--project", project)
