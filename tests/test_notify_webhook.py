"""The webhook channel against receivers that misbehave, with a real sidecar whose agent waits on
permission requests (the hook stand-in of tests/standin.py): a 500 is tried again with backoff
and a 4xx is not; a receiver that hangs, or answers after 30 s, is given up after 10 s while the
API and the agent go on; a redirect to another host is not followed; a 1 GB answer is not read;
the queue is bounded; and a webhook off the egress allowlist still gets the sidecar's own
notifications, which the CLI can neither send nor see where they go."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from aiohttp import web

from sidecar.agent.approvals import Approvals
from sidecar.agent.machine import AgentMachine
from sidecar.config import Config, NotifyConfig
from sidecar.core.events import EventBus
from sidecar.notify.delivery import QUEUE
from sidecar.notify.service import Notifier
from tests.harness import Sidecar, running_sidecar, wait_for, write_cli_config
from tests.notifytools import (  # receivers: a fixture
    WEBHOOK_SECRET,
    Receiver,
    Seen,
    WebhookReceiver,
    held,
    ok,
    receivers,
    status,
    webhook_env,
)
from tests.proctools import init_of, supervisor_of
from tests.standin import HeldHook, waiting_sidecar

pytestmark = pytest.mark.timeout(120)


__all__ = ["receivers"]  # the fixture, imported for pytest


def start(receivers: list[Receiver], receiver: Receiver) -> Any:
    receivers.append(receiver.start())
    return receiver


def waiting(
    make_sidecar: Callable[..., Sidecar], tmp: Path, hook: WebhookReceiver, **extra: str
) -> Sidecar:
    env = webhook_env(tmp, hook, SIDECAR_NOTIFY_DWELL="0", SIDECAR_NOTIFY_COOLDOWN="0", **extra)
    return waiting_sidecar(make_sidecar, tmp, "make deploy", **env)


def ask_again(sc: Sidecar, command: str) -> HeldHook:
    """Another permission request (a second hook call, held like the first)."""
    return HeldHook(sc, {"tool_name": "Bash", "tool_input": {"command": command}})


def webhook_status(sc: Sidecar) -> dict[str, Any]:
    return dict(sc.status()["notify"]["channels"][0])


def test_a_500_is_tried_again_with_backoff_and_a_4xx_is_not(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    answers = [status(500), status(503), ok, status(400), ok]
    hook = start(receivers, WebhookReceiver(answers))
    sc = waiting(make_sidecar, short_tmp, hook)
    first = hook.wait(3, 15, what="two failures and the delivery")
    assert all(s.problems == [] for s in first), [s.problems for s in first]
    ids = {s.headers["X-Sleeve-Delivery"] for s in first}
    assert len(ids) == 1 and {s.payload["id"] for s in first} == ids
    # Backoff: 1 s, then 3 s (each retry signed anew: its own `t`).
    assert first[1].at - first[0].at >= 0.95 and first[2].at - first[1].at >= 2.95
    wait_for(lambda: webhook_status(sc)["sent"] == 1, 5, what="one sent")

    ask_again(sc, "make test")
    hook.wait(4, 10, what="the second notification")
    ask_again(sc, "make lint")
    seen = hook.wait(5, 10, what="the third notification")
    # The 400 was not tried again: the next request is the third notification's.
    assert [s.payload["approval"]["summary"] for s in seen[3:]] == ["make test", "make lint"]
    channel = wait_for(lambda: (c := webhook_status(sc))["sent"] == 2 and c, 5, what="counts")
    assert channel["failed"] == 1 and channel["last"]["ok"]
    metrics = sc.get("/metrics").body.decode()
    assert 'sidecar_notifications_total{channel="webhook",outcome="sent"} 2' in metrics
    assert 'sidecar_notifications_total{channel="webhook",outcome="failed"} 1' in metrics


@pytest.mark.slow
def test_a_webhook_that_hangs_is_given_up_after_10_s_and_holds_up_nothing(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    hook = start(receivers, WebhookReceiver([held(60)]))
    sc = waiting(make_sidecar, short_tmp, hook)
    (seen,) = hook.wait(1, what="the notification")
    # The API and the agent go on meanwhile: the request is answered and the hook told while
    # the webhook's request is still open.
    assert sc.get("/health").status == 200
    approval = sc.get("/approvals").body["approvals"][0]
    assert sc.post(f"/approvals/{approval['id']}", {"decision": "allow"}).status == 200
    sc.held_hook.thread.join(5)
    assert sc.held_hook.reply is not None and sc.held_hook.reply.status == 200
    assert seen.ended is None, "the webhook's request was over before the rest went on"
    # The sender hangs up after 10 s (the receiver would hold it 60 s); the notification is no
    # longer true, so it is not retried.
    wait_for(lambda: seen.ended, 15, what="the sidecar giving up")
    assert seen.ended is not None and seen.ended - seen.at >= 9.5
    channel = wait_for(lambda: (c := webhook_status(sc))["failed"] == 1 and c, 5, what="failed")
    assert channel["last"] == {**channel["last"], "ok": False, "detail": "no answer within 10 s"}
    assert len(hook.seen) == 1


@pytest.mark.slow
def test_a_webhook_that_answers_after_30_s_is_given_up_at_10_s_and_tried_again(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    hook = start(receivers, WebhookReceiver([held(30, then=200), ok]))
    sc = waiting(make_sidecar, short_tmp, hook)
    first, second = hook.wait(2, 20, what="the attempt after the first one's 10 s")
    assert first.ended is not None and first.ended - first.at >= 9.5  # not before its 10 s
    assert first.headers["X-Sleeve-Delivery"] == second.headers["X-Sleeve-Delivery"]
    assert second.at - first.ended >= 0.95  # the backoff
    wait_for(
        lambda: webhook_status(sc)["sent"] == 1,
        5,
        what=lambda: f"delivered on the retry (the channel: {webhook_status(sc)})",
    )


def test_a_redirect_is_not_followed_to_another_host(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    elsewhere = start(receivers, Receiver(host="127.0.0.2"))
    to = {"Location": elsewhere.url + "/steal"}
    hook = start(receivers, WebhookReceiver([status(307, to)]))
    sc = waiting(make_sidecar, short_tmp, hook)
    channel = wait_for(lambda: (c := webhook_status(sc))["failed"] == 1 and c, 10, what="failed")
    assert channel["last"]["detail"] == "answered 307: redirects are not followed"
    assert len(hook.seen) == 1 and elsewhere.seen == []


async def one_gigabyte(request: web.Request, seen: Seen) -> web.StreamResponse:
    """200 with a 1 GiB body, written until the client hangs up; `seen.payload` counts it."""
    response = web.StreamResponse(status=200, headers={"Content-Length": str(1 << 30)})
    await response.prepare(request)
    chunk, seen.payload = b"x" * (1 << 20), 0
    try:
        for _ in range(1 << 10):
            await response.write(chunk)
            seen.payload += len(chunk)
    except (ConnectionError, asyncio.CancelledError):
        seen.ended = time.monotonic()
        raise
    return response


def test_a_1_gb_answer_is_not_read(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path, receivers: list[Receiver]
) -> None:
    hook = start(receivers, WebhookReceiver([one_gigabyte]))
    sc = waiting(make_sidecar, short_tmp, hook)
    supervisor = supervisor_of(init_of(sc))
    assert supervisor is not None
    rss = supervisor.memory_info().rss
    (seen,) = hook.wait(1, what="the notification")
    wait_for(lambda: seen.ended, 10, what="the sidecar hanging up")
    assert seen.payload < 64 << 20, seen.payload  # what the kernel's buffers took, no more
    channel = wait_for(lambda: (c := webhook_status(sc))["sent"] == 1 and c, 5, what="sent")
    assert channel["last"]["detail"] == "answered 200"
    assert supervisor.memory_info().rss - rss < 16 << 20


async def test_the_queue_is_bounded_and_what_does_not_fit_is_counted_failed(
    tmp_path: Path,
) -> None:
    """In-process: a receiver that never answers keeps the channel's one worker busy."""
    hook = WebhookReceiver([held(60)]).start()
    try:
        notify = NotifyConfig(
            webhook=hook.url, webhook_secret=WEBHOOK_SECRET, dwell=0.0, cooldown=0.0
        )
        config = Config(sleeve_name="q", cli="shell", state_dir=tmp_path, notify=notify)
        bus = EventBus()
        approvals = Approvals(None, lambda a, b: None)
        notifier = Notifier(config, bus, AgentMachine(bus), approvals)
        notifier.start()
        from sidecar.notify.rules import Due

        extra = 5
        for n in range(QUEUE + 1 + extra):  # one in the worker's hands, QUEUE waiting
            notifier.send(Due("budget", "budget", f"number {n}"))
            await asyncio.sleep(0)  # sleep-ok: one loop turn: the worker takes the first
        channel = notifier.info().channels[0]
        assert channel.failed == extra
        assert channel.last is not None and channel.last.detail.startswith("dropped")
        await notifier.close()
    finally:
        hook.stop()


ESCAPE = """\
import json, os, socket, sys, urllib.request
report, port = sys.argv[1], int(sys.argv[2])
out = {"env": sorted(k for k in os.environ if k.startswith("SIDECAR_NOTIFY"))}
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    out["direct"] = "ok"
except OSError as exc:
    out["direct"] = exc.errno
try:
    urllib.request.urlopen(f"http://127.0.0.1:{port}/from-the-cli", data=b"{}", timeout=5)
    out["proxy"] = 200
except urllib.error.HTTPError as exc:
    out["proxy"] = exc.code
except OSError as exc:
    out["proxy"] = str(exc)
ancestors, pid = {}, os.getppid()
while pid > 1:  # the pane, tmux, the sidecar's init: every environment up the tree
    try:
        ancestors[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except OSError:
        break
out["ancestors"] = ancestors
open(report, "w").write(json.dumps(out))
import signal; signal.pause()
"""


def test_a_webhook_off_the_egress_allowlist_still_gets_the_sidecars_notifications(
    tmp_path: Path, receivers: list[Receiver]
) -> None:
    """The sidecar's own deliveries are not the CLI's: they go straight out, not through the
    egress proxy. The CLI can reach the receiver neither directly nor through the proxy, and
    sees its URL in no environment (its own, or the sidecar's /proc/<pid>/environ)."""
    hook = start(receivers, WebhookReceiver())
    script = tmp_path / "escape.py"
    script.write_text(ESCAPE)
    port = hook.url.rsplit(":", 1)[1]
    env = webhook_env(tmp_path, hook, SIDECAR_EGRESS_ALLOW="example.com")
    with running_sidecar(tmp_path, cli="escape", env_extra=env) as sc:
        report = sc.workspace / "report.json"  # the guarded CLI writes in its workspace only
        clis = write_cli_config(
            tmp_path / "clis.yaml",
            {"escape": {"command": [sys.executable, str(script), str(report), port]}},
        )
        sc.env_extra["SIDECAR_CLI_CONFIG"] = str(clis)
        sc.start()
        assert sc.proc is not None
        got = wait_for(
            lambda: json.loads(report.read_text()) if report.exists() else None, 20, what="report"
        )
        assert got["env"] == []
        assert got["direct"] != "ok" and got["proxy"] == 403, got
        # What the guarded CLI could read up its tree (under the guard, with no capabilities,
        # nothing: its ancestors have some), and every process of the sidecar's, read here.
        assert not any(hook.url in environ for environ in got["ancestors"].values())
        init = psutil.Process(sc.proc.pid)
        for proc in (init, *init.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):
                assert not any(hook.url in v for v in proc.environ().values()), proc
        assert hook.seen == []
        tested = sc.post("/notify/test")
        assert tested.status == 200
        assert tested.body == {
            "results": [{"channel": "webhook", "ok": True, "detail": "answered 200"}]
        }
        (seen,) = hook.seen
        assert seen.path == "/hook" and seen.problems == [] and seen.payload["event"] == "test"
