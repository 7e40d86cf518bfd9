"""The notification settings (SIDECAR_PUBLIC_URL, SIDECAR_NOTIFY_*): read once, with the
contract's defaults; a channel misconfigured at start exits 2 with one line naming the variable;
and none of them reaches the CLI's environment."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import Config, ConfigError
from tests.commands import run_sidecar

BASE = {"SLEEVE_NAME": "n", "SLEEVE_CLI": "shell"}


def test_the_defaults_are_the_contracts_and_no_channel_is_on() -> None:
    n = Config.from_env(BASE).notify
    assert (n.webhook, n.ntfy, n.webpush, n.public_url) == (None, None, False, None)
    assert n.on == {"waiting", "exited"} and (n.dwell, n.cooldown) == (5.0, 60.0)
    assert not n.any_channel


def test_every_setting_is_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    token = tmp_path / "ntfy-token"
    token.write_text("tk_abc\n")
    env = {
        **BASE,
        "SIDECAR_PUBLIC_URL": "https://sleeve.example:8443/s/1/",
        "SIDECAR_NOTIFY_WEBHOOK": "https://hooks.example/in?x=1",
        "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE": str(secret),
        "SIDECAR_NOTIFY_NTFY": "https://ntfy.example/my_topic-1",
        "SIDECAR_NOTIFY_NTFY_TOKEN_FILE": str(token),
        "SIDECAR_NOTIFY_WEBPUSH": "ON",
        "SIDECAR_NOTIFY_ON": "waiting, idle egress",
        "SIDECAR_NOTIFY_DWELL": "0.5",
        "SIDECAR_NOTIFY_COOLDOWN": "0",
    }
    cfg = Config.from_env(env)
    n = cfg.notify
    assert n.public_url == "https://sleeve.example:8443/s/1"
    assert (n.webhook, n.webhook_secret) == ("https://hooks.example/in?x=1", "s3cret")
    assert (n.ntfy, n.ntfy_token, n.webpush) == ("https://ntfy.example/my_topic-1", "tk_abc", True)
    assert n.on == {"waiting", "idle", "egress"} and (n.dwell, n.cooldown) == (0.5, 0.0)
    assert "s3cret" not in repr(cfg) and "tk_abc" not in repr(cfg)
    # The CLI learns none of it: where notifications go is the person's, not the agent's.
    assert not [k for k in cfg.child_env if k.startswith("SIDECAR_NOTIFY_")]


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"SIDECAR_NOTIFY_WEBHOOK": "hooks.example/in"}, "SIDECAR_NOTIFY_WEBHOOK must be an http"),
        ({"SIDECAR_NOTIFY_WEBHOOK": "ftp://hooks.example/"}, "SIDECAR_NOTIFY_WEBHOOK must be"),
        ({"SIDECAR_NOTIFY_WEBHOOK": "https://h:99999/"}, "SIDECAR_NOTIFY_WEBHOOK must be"),
        (
            {"SIDECAR_NOTIFY_WEBHOOK": "https://hooks.example/in"},
            "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE is required with SIDECAR_NOTIFY_WEBHOOK",
        ),
        (
            {
                "SIDECAR_NOTIFY_WEBHOOK": "https://hooks.example/in",
                "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE": "/nonexistent/secret",
            },
            "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE: /nonexistent/secret does not exist",
        ),
        (
            {
                "SIDECAR_NOTIFY_WEBHOOK": "https://hooks.example/in",
                "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE": "/",
            },
            "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE: / is a directory",
        ),
        ({"SIDECAR_NOTIFY_NTFY": "https://ntfy.sh/"}, "SIDECAR_NOTIFY_NTFY must be the URL of"),
        ({"SIDECAR_NOTIFY_NTFY": "https://ntfy.sh/a?b=c"}, "SIDECAR_NOTIFY_NTFY must be an"),
        (
            {"SIDECAR_NOTIFY_NTFY": "https://ntfy.sh/t", "SIDECAR_NOTIFY_NTFY_TOKEN_FILE": "/no"},
            "SIDECAR_NOTIFY_NTFY_TOKEN_FILE: /no does not exist",
        ),
        ({"SIDECAR_NOTIFY_WEBPUSH": "on"}, "SIDECAR_NOTIFY_WEBPUSH=on needs SIDECAR_PUBLIC_URL"),
        ({"SIDECAR_NOTIFY_WEBPUSH": "maybe"}, "SIDECAR_NOTIFY_WEBPUSH must be off or on"),
        ({"SIDECAR_PUBLIC_URL": "https://s.example/?token=x"}, "SIDECAR_PUBLIC_URL must be"),
        ({"SIDECAR_PUBLIC_URL": "https://user:pw@s.example/"}, "SIDECAR_PUBLIC_URL must be"),
        ({"SIDECAR_NOTIFY_ON": "waiting,sometimes"}, "SIDECAR_NOTIFY_ON must list some of"),
        ({"SIDECAR_NOTIFY_DWELL": "-1"}, "SIDECAR_NOTIFY_DWELL must be between 0 and 3600"),
        ({"SIDECAR_NOTIFY_COOLDOWN": "soon"}, "SIDECAR_NOTIFY_COOLDOWN must be a number"),
    ],
)
def test_a_misconfigured_channel_exits_2_naming_the_variable(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        Config.from_env({**BASE, **env})
    done = run_sidecar({**BASE, **env}, tmp_path)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
