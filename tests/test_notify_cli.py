"""`sidecar notify test` against a real sidecar, as a person checking their setup from
`docker exec` would run it: one test notification per channel, each channel's answer printed,
and a failing channel failing the command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.commands import CLI_TOKEN, sidecar_cmd
from tests.harness import Sidecar
from tests.notifytools import (  # receivers: a fixture
    NtfyStandIn,
    Receiver,
    WebhookReceiver,
    ntfy_answer,
    receivers,
    status,
    webhook_env,
)

__all__ = ["receivers"]  # the fixture, imported for pytest


def test_each_channel_is_tried_and_a_failing_one_fails_the_command(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    hook = WebhookReceiver().start()
    ntfy = NtfyStandIn([status(502), ntfy_answer]).start()
    receivers += [hook, ntfy]
    env = webhook_env(
        short_tmp, hook, SIDECAR_NOTIFY_NTFY=f"{ntfy.url}/cli-topic", SIDECAR_TOKEN=CLI_TOKEN
    )
    sc = make_sidecar(env_extra=env).start()

    failed = sidecar_cmd(sc, "notify", "test")
    assert failed.returncode == 1, failed.stderr
    lines = failed.stdout.splitlines()
    assert lines == ["webhook   ok      answered 200", "ntfy      FAILED  answered 502: status 502"]
    (seen,) = hook.seen
    assert seen.problems == [] and seen.payload["event"] == "test"

    passed = sidecar_cmd(sc, "notify", "test", "--json")
    assert passed.returncode == 0, passed.stderr
    results = json.loads(passed.stdout)["results"]
    assert [(r["channel"], r["ok"]) for r in results] == [("webhook", True), ("ntfy", True)]
    assert ntfy.seen[-1].problems == [] and ntfy.seen[-1].payload["title"].endswith(
        "test notification"
    )


def test_without_a_channel_it_says_so(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_TOKEN": CLI_TOKEN}).start()
    done = sidecar_cmd(sc, "notify", "test")
    assert done.returncode == 0
    assert done.stdout == "(no notification channel is configured: SIDECAR_NOTIFY_*)\n"
