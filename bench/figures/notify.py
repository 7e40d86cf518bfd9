"""Notifications. With the real Claude Code: its permission dialog on screen → the signed webhook
received (target: the dwell + 300 ms; beside the dwell counted from the `agent-state` event an
/events reader sees), and a one-tap link's POST → the tool starts (≤ 100 ms; beside the same
answer through `POST /approvals`), interleaved. And what the notifier costs while nothing
happens, all three channels on (a webhook, ntfy, Web Push with a device subscribed), beside the
same sidecar without notifications, side by side: the supervisor's wake-ups a second and its
memory (USS)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from bench import rigs
from bench.context import Context
from bench.core import Baseline, Figure, at_most, interleave
from bench.figures.approvals import TOOL, _started
from bench.procs import (
    BenchError,
    children_of,
    get_json,
    make_sidecar,
    memory,
    post_json,
    running,
    wait_until,
)
from tests.agenttools import claude_env
from tests.harness import Sidecar
from tests.notifytools import (
    NtfyStandIn,
    PushService,
    WebhookReceiver,
    ntfy_answer,
    secret_file,
)

NAMES = ("notify.dialog_webhook", "notify.link_allow", "notify.idle_wakeups", "notify.memory")
DWELL = 1.0
DIALOG = "Do you want to proceed"


def _claude(ctx: Context, hook: WebhookReceiver) -> rigs.SidecarRig:
    tmp = ctx.scratch("nt")
    stub = rigs.Stub(bash_command=TOOL).start()
    sc = make_sidecar(
        tmp,
        cli="claude-code",
        SIDECAR_NOTIFY_WEBHOOK=hook.url,
        SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE=str(secret_file(tmp)),
        SIDECAR_NOTIFY_DWELL=str(DWELL),
        SIDECAR_NOTIFY_COOLDOWN="0",
    )
    sc.env_extra["SIDECAR_PUBLIC_URL"] = sc.url
    sc.env_extra.update(claude_env(sc, stub))
    return rigs.SidecarRig(sc, stub).start()


def _prompts(ctx: Context) -> dict[str, list[float]]:
    """One dialog per cycle, answered by its link or through the API, in turn."""
    hook = WebhookReceiver().start()
    rig = _claude(ctx, hook)
    port, workspace = rig.sc.port, rig.sc.workspace
    runs = iter(range(10**6))

    def idle() -> bool:
        code, body = get_json(port, "/status")
        return code == 200 and body["agent"]["state"] == "idle"

    def cycle(answer: str) -> dict[str, float]:
        run_no, told = next(runs), len(hook.seen)
        wait_until(idle, 30, "the agent idle")
        asked = time.time()
        code, body = post_json(port, "/input", {"text": "run it", "if_state": ["idle"]})
        if code != 202:
            raise BenchError(f"POST /input: {code} {body}")
        on_screen = rig.pane.wait(lambda text: DIALOG in text, 30, "the permission dialog")
        seen = wait_until(lambda: hook.seen[told:], 30, "the webhook")[0]
        if seen.problems:
            raise BenchError(f"the webhook's request: {seen.problems}")
        waiting = rig.states.first(lambda s: s == "waiting", asked, time.time() + 5)
        if waiting is None:
            raise BenchError("no agent-state waiting on /events")
        approval = seen.payload["approval"]
        sent = time.time()
        if answer == "link":
            code, body = post_json(port, approval["actions"]["allow"].removeprefix(rig.sc.url))
        else:
            code, body = post_json(port, f"/approvals/{approval['id']}", {"decision": "allow"})
        if code != 200:
            raise BenchError(f"the answer was refused: {code} {body}")
        started = wait_until(lambda: _started(workspace, run_no), 30, "the tool started")
        return {
            "webhook": seen.wall - on_screen,
            "events": waiting - on_screen + DWELL,
            "answer": started - sent,
        }

    try:
        got = interleave(
            ctx.pick(1, 8), {"link": lambda: cycle("link"), "api": lambda: cycle("api")}
        )
    finally:
        rig.close()
        hook.stop()
    return got


def _supervisor(sc: Sidecar) -> psutil.Process:
    assert sc.proc is not None
    for pid in children_of(sc.proc.pid):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if "sidecar" in " ".join(proc.cmdline()):
                return proc
    msg = "no supervisor under the sidecar's init"
    raise BenchError(msg)


def _wakeups(proc: psutil.Process) -> int:
    """Voluntary context switches of every thread of `proc` so far: each is a sleep that ended,
    a wake-up (preemptions, which depend on the machine's load, are not counted)."""
    total = 0
    for tid in os.listdir(f"/proc/{proc.pid}/task"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{proc.pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total += int(line.split()[1])
    return total


@contextlib.contextmanager
def _channels() -> Iterator[tuple[WebhookReceiver, NtfyStandIn, PushService]]:
    hook, ntfy, push = WebhookReceiver(), NtfyStandIn([ntfy_answer]), PushService()
    for receiver in (hook, ntfy, push):
        receiver.start()
    try:
        yield hook, ntfy, push
    finally:
        for receiver in (hook, ntfy, push):
            receiver.stop()


def _idle(ctx: Context) -> list[Figure]:
    window = ctx.seconds(5, 30)
    with _channels() as (hook, ntfy, push):
        tmp = ctx.scratch("nw")
        env = {
            "SIDECAR_NOTIFY_WEBHOOK": hook.url,
            "SIDECAR_NOTIFY_WEBHOOK_SECRET_FILE": str(secret_file(tmp)),
            "SIDECAR_NOTIFY_NTFY": f"{ntfy.url}/bench",
            "SIDECAR_NOTIFY_WEBPUSH": "on",
            "SIDECAR_PUBLIC_URL": "http://127.0.0.1",
        }
        with running(tmp, **env) as notifying, running(ctx.scratch("np")) as plain:
            device = push.browser("bench").subscription()
            code, body = post_json(notifying.port, "/notify/webpush/subscriptions", device)
            if code != 201:
                raise BenchError(f"subscribing: {code} {body}")
            post_json(plain.port, "/notify/webpush/subscriptions", device)  # the same request: 404
            procs = {"with": _supervisor(notifying), "without": _supervisor(plain)}
            time.sleep(ctx.seconds(3, 5))  # sleep-ok: both settle after their start (the shell)
            before = {k: _wakeups(p) for k, p in procs.items()}
            began = time.monotonic()
            time.sleep(window)  # sleep-ok: the idle window being measured
            wall = time.monotonic() - began
            rates = {k: (_wakeups(p) - before[k]) / wall for k, p in procs.items()}
            uss = {k: memory([p]).uss for k, p in procs.items()}
            # The first push loads the crypto libraries: what a device that is used costs.
            code, body = post_json(notifying.port, "/notify/test", timeout=30)
            if code != 200 or not all(r["ok"] for r in body["results"]):
                raise BenchError(f"the test notification: {code} {body}")
            used = memory([procs["with"]]).uss
    return [
        Figure(
            "notify.idle_wakeups",
            f"idle supervisor wake-ups, notifications on (3 channels) minus off, {wall:.0f} s",
            "/s",
            [rates["with"] - rates["without"]],
            target=at_most(0.1, "0 more a second"),
            notes=f"on {rates['with']:.2f}/s, off {rates['without']:.2f}/s (the 1 s tick)",
        ),
        Figure(
            "notify.memory",
            "idle supervisor memory, notifications on (3 channels) minus off (USS)",
            "MiB",
            [uss["with"] - uss["without"]],
            target=at_most(1.5, "≤1.5 MiB more"),
            notes=f"on {uss['with']:.1f}, off {uss['without']:.1f} MiB; after the first Web "
            f"Push (crypto loaded) {used - uss['without']:+.1f} MiB",
        ),
    ]


def run(ctx: Context) -> list[Figure]:
    got = _prompts(ctx)
    dwell = f"dwell {DWELL:g} s"
    return [
        Figure(
            "notify.dialog_webhook",
            f"notify: permission dialog on screen → signed webhook received ({dwell})",
            "s",
            got["link.webhook"] + got["api.webhook"],
            Baseline(
                "the dwell counted from the agent-state event on /events",
                got["link.events"] + got["api.events"],
            ),
            at_most(DWELL + 0.3, f"≤ dwell + 300 ms ({DWELL + 0.3:g} s)"),
        ),
        Figure(
            "notify.link_allow",
            "notify: one-tap link POST → its tool starts",
            "s",
            got["link.answer"],
            Baseline("the same, allowed through POST /approvals", got["api.answer"]),
            at_most(0.1, "≤100 ms median"),
        ),
        *_idle(ctx),
    ]
