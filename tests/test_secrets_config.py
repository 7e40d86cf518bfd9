"""SIDECAR_SECRETS_FILE read once at start: every bad input is a ConfigError naming the file, the
secret and what is wrong (exit 2 in a real `sidecar run`); a good file gives each secret its
value (one trailing newline stripped) and keeps the from_env variables out of the CLI's
environment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import Config, ConfigError
from sidecar.config.secrets import hidden_variables
from tests.commands import run_sidecar

VALUE = "sk-real-0123456789abcdef"
ALLOW = "api.example.com, *.github.com, localhost:8081"
UID = GID = 23456  # SIDECAR_USER in the tests that need another user (no passwd entry)


def env_for(tmp_path: Path, doc: Any, **extra: str) -> dict[str, str]:
    path = tmp_path / "secrets.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return {
        "SLEEVE_NAME": "a",
        "SLEEVE_CLI": "shell",
        "SIDECAR_EGRESS_ALLOW": ALLOW,
        "SIDECAR_SECRETS_FILE": str(path),
        "SLEEVE_SECRET": VALUE,
        **extra,
    }


def one(**fields: Any) -> dict[str, Any]:
    entry = {"name": "api", "env": "API_KEY", "from_env": "SLEEVE_SECRET"}
    entry.update(fields)
    return {"secrets": [{k: v for k, v in entry.items() if v is not None}]}


def value_file(tmp_path: Path, data: bytes, mode: int = 0o400) -> str:
    path = tmp_path / "value"
    path.write_bytes(data)
    path.chmod(mode)
    return str(path)


def test_a_from_env_secret_is_read_and_its_variable_kept_from_the_cli(tmp_path: Path) -> None:
    env = env_for(tmp_path, one(hosts=["api.example.com", "*.github.com"]))
    cfg = Config.from_env(env)
    (secret,) = cfg.secrets
    assert (secret.name, secret.env, secret.value) == ("api", "API_KEY", VALUE)
    assert [h.text for h in secret.hosts] == ["api.example.com", "*.github.com"]
    assert "SLEEVE_SECRET" not in cfg.child_env
    assert "SIDECAR_SECRETS_FILE" not in cfg.child_env
    assert VALUE not in repr(cfg)  # a logged configuration shows no value
    assert hidden_variables(env) == ("SLEEVE_SECRET", "API_KEY")


def test_a_value_under_the_clis_variable_in_the_sidecars_environment_is_kept_from_it(
    tmp_path: Path,
) -> None:
    env = env_for(tmp_path, one(hosts=["api.example.com"]), API_KEY=VALUE)
    assert "API_KEY" not in Config.from_env(env).child_env


def test_a_file_secret_loses_one_trailing_newline_and_must_be_root_only(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("SIDECAR_USER needs the test to run as root")  # skip-ok: as the guard's
    path = value_file(tmp_path, VALUE.encode() + b"\n")
    env = env_for(tmp_path, one(from_env=None, file=path, hosts=["api.example.com"]))
    cfg = Config.from_env({**env, "SIDECAR_USER": f"{UID}:{GID}"})
    assert cfg.secrets[0].value == VALUE
    assert cfg.secrets[0].from_env is None


def _error(env: dict[str, str]) -> str:
    with pytest.raises(ConfigError) as caught:
        Config.from_env(env)
    message = str(caught.value)
    assert message.startswith("SIDECAR_SECRETS_FILE"), message
    assert VALUE not in message
    return message


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("", "must be a mapping with one key"),
        ("secrets: [\n", "is not valid YAML"),
        ({"secrets": []}, "a list of 1 to 64 secrets"),
        ({"secrets": [], "other": 1}, "must be a mapping with one key"),
        ({"secrets": ["api"]}, "secret 1 must be a mapping"),
        (one(hosts=["api.example.com"], color="red"), "secret 1: unknown key 'color'"),
        (one(hosts=["api.example.com"], name="a b"), "name must be a name of letters"),
        (one(hosts=["api.example.com"], env="API-KEY"), "env must be a variable name"),
        (one(hosts=["api.example.com"], env="HTTPS_PROXY"), "env HTTPS_PROXY is the sidecar's"),
        (one(hosts=["api.example.com"], env="SIDECAR_TOKEN"), "env SIDECAR_TOKEN is the"),
        (one(hosts=["api.example.com"], from_env=None), "exactly one of file and from_env"),
        (one(hosts=["api.example.com"], file="/x"), "exactly one of file and from_env"),
        (one(hosts=["api.example.com"], from_env="NOT_SET"), "from_env NOT_SET is not set"),
        (one(hosts=None), "hosts must be a list of host patterns"),
        (one(hosts=[]), "hosts must be a list of host patterns"),
        (one(hosts=["https://api.example.com"]), "no scheme"),
        (one(hosts=["api.example.com:443"]), "no port"),
        (one(hosts=["api.other.com"]), "host api.other.com is not on the egress allowlist"),
        (one(hosts=["*.example.com"]), "host *.example.com is not on the egress allowlist"),
        (
            {
                "secrets": [
                    one(hosts=["api.example.com"])["secrets"][0],
                    one(hosts=["api.example.com"], name="b")["secrets"][0],
                ]
            },
            "secrets 'api' and 'b' both set API_KEY",
        ),
        (
            {
                "secrets": [
                    one(hosts=["api.example.com"])["secrets"][0],
                    one(hosts=["api.example.com"], env="B")["secrets"][0],
                ]
            },
            "two secrets are named 'api'",
        ),
    ],
)
def test_a_bad_secrets_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, doc: Any, says: str
) -> None:
    assert says in _error(env_for(tmp_path, doc))


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("sk-real\r\nX-Evil: 1", "must not contain control characters"),  # header injection
        ("sk-real\nmore-of-it", "must not contain control characters"),
        ("sk-real\x00more-of-it", "must not contain control characters"),
        ("short", "is too short"),
        ("sk-real-ünïcode-value", "is not ASCII"),
    ],
)
def test_a_value_that_cannot_go_in_a_header_is_refused(
    tmp_path: Path, value: str, says: str
) -> None:
    env = env_for(tmp_path, one(hosts=["api.example.com"]), SLEEVE_SECRET=value)
    assert says in _error(env)


def test_secrets_need_the_egress_allowlist(tmp_path: Path) -> None:
    env = env_for(tmp_path, one(hosts=["api.example.com"]))
    del env["SIDECAR_EGRESS_ALLOW"]
    message = _error(env)
    assert "needs SIDECAR_EGRESS_ALLOW" in message
    assert "the egress proxy is the only way a real value goes out" in message


def test_a_secrets_file_that_is_missing_or_too_big_is_refused(tmp_path: Path) -> None:
    env = env_for(tmp_path, one(hosts=["api.example.com"]))
    big = tmp_path / "big.yaml"
    big.write_text("#" * (64 * 1024 + 1))
    assert "is larger than 64 KiB" in _error({**env, "SIDECAR_SECRETS_FILE": str(big)})
    gone = str(tmp_path / "gone.yaml")
    assert "cannot read" in _error({**env, "SIDECAR_SECRETS_FILE": gone})


def test_in_one_uid_mode_a_value_file_is_refused_naming_it(tmp_path: Path) -> None:
    """Without SIDECAR_USER the CLI runs as the sidecar's uid: a file the sidecar reads, it
    could read."""
    path = value_file(tmp_path, VALUE.encode())
    message = _error(env_for(tmp_path, one(from_env=None, file=path, hosts=["api.example.com"])))
    assert f"file {path} is readable by the CLI" in message
    assert "use from_env" in message


@pytest.mark.parametrize(
    ("data", "mode", "says"),
    [
        (None, 0o400, "does not exist"),
        (b"", 0o400, "is empty"),
        (b"\n", 0o400, "is empty"),
        (b"x" * (64 * 1024 + 3), 0o400, "is larger than 65536 bytes"),
        (VALUE.encode(), 0o444, "is readable by the CLI's user"),
        (b"sk-one\nsk-two-of-them", 0o400, "must not contain control characters"),
        (b"\xff\xfe-not-utf-8", 0o400, "is not UTF-8 text"),
        (b"dir", 0o500, "is a directory"),
    ],
)
def test_with_sidecar_user_a_bad_value_file_is_refused(
    tmp_path: Path, data: bytes | None, mode: int, says: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("SIDECAR_USER needs the test to run as root")  # skip-ok: as the guard's
    if data == b"dir":
        path = str(tmp_path / "a-dir")
        os.mkdir(path, mode)
    else:
        path = value_file(tmp_path, data, mode) if data is not None else str(tmp_path / "none")
    env = env_for(tmp_path, one(from_env=None, file=path, hosts=["api.example.com"]))
    assert says in _error({**env, "SIDECAR_USER": f"{UID}:{GID}"})


def test_a_real_sidecar_exits_2_with_one_line_naming_the_problem(tmp_path: Path) -> None:
    env = env_for(tmp_path, one(hosts=["api.other.com"]))
    env.pop("SIDECAR_EGRESS_ALLOW")
    done = run_sidecar({**env, "SIDECAR_EGRESS_ALLOW": "api.example.com"}, tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "sidecar: SIDECAR_SECRETS_FILE: secret 'api': host api.other.com is not on the egress "
        "allowlist"
    ]
    assert VALUE not in done.stderr + done.stdout


def test_secrets_without_the_openssl_command_are_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sleeve's CA is made by `openssl`: a machine without it is told at start, not at the
    first HTTPS request. (PATH pointed at an empty directory: the OS seam that makes it absent.)"""
    env = env_for(tmp_path, one(hosts=["api.example.com"]))
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(ConfigError, match=r"the openssl command .* is not on PATH"):
        Config.from_env(env)
