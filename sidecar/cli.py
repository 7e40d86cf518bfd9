"""`sidecar status|screen|outbox|inbox|send|resleeve|events|attach|input|keys|wait|approvals|
approve|deny|audit|policy|recordings|notify test`: debugging from `docker exec`, through the
local API (address and token from the same environment the sidecar reads); human output by
default, `--json` for machines. `sidecar policy check FILE` reads only the file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.client import ClientError, SidecarClient
from sidecar.core.contract import (
    AGENT_STATES,
    DEFAULT_STATE_DIR,
    INPUT_KEYS,
    MESSAGE_TYPES,
    TMUX_SESSION,
)


def _print_status(s: dict[str, Any]) -> None:
    progress = s.get("progress") or {}
    pid = s.get("cli_pid")
    print(f"sleeve    {s.get('sleeve_id')}  ({s.get('health')})")
    print(f"cli       {s.get('cli')}  {s.get('cli_state', '')}{f'  pid {pid}' if pid else ''}")
    print(f"status    {s.get('status')}")
    print(f"task      {s.get('current_task') or '-'}")
    print(f"progress  {progress.get('completed', 0)}/{progress.get('total', 0)}")
    for blocker in s.get("blockers") or []:
        print(f"blocker   {blocker}")
    agent = s.get("agent") or {}
    if agent:
        reason = f"  ({agent['reason']})" if agent.get("reason") else ""
        print(f"agent     {agent.get('state')} since {agent.get('since')}{reason}")
        print(f"          source {agent.get('source')}, session {agent.get('session_id') or '-'}")
    print(f"activity  {s.get('last_activity') or '-'}")
    for warning in s.get("warnings") or []:
        print(f"warning   {warning}")


def _print_screen(screen: dict[str, Any]) -> None:
    """The lines as the screen shows them; empty lines at the bottom are left out."""
    lines = list(screen.get("lines") or [])
    while lines and not lines[-1]:
        lines.pop()
    for line in lines:
        print(line)


def _print_messages(body: dict[str, Any]) -> None:
    messages = body.get("messages") or []
    if not messages:
        print("(no messages)")
    for m in messages:
        head = (
            f"[{m.get('timestamp') or '?'}] {m.get('id')}  {m.get('from')} -> {m.get('to') or '*'}"
        )
        head += f"  {m.get('type')}"
        if m.get("thread"):
            head += f"  #{m['thread']}"
        print(head)
        for line in str(m.get("content", "")).splitlines() or [""]:
            print(f"    {line}")
    for warning in body.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr)


def _print_approvals(body: dict[str, Any]) -> None:
    approvals = body.get("approvals") or []
    if not approvals:
        print("(no permission requests)")
        return
    rows = [(str(a.get("id")), str(a.get("tool")), str(a.get("since"))) for a in approvals]
    id_width = max(len("id"), *(len(r[0]) for r in rows))
    tool_width = max(len("tool"), *(len(r[1]) for r in rows))
    since_width = max(len("since"), *(len(r[2]) for r in rows))
    line = f"{{:{id_width}}}  {{:{tool_width}}}  {{:{since_width}}}  {{}}"
    print(line.format("id", "tool", "since", "summary"))
    # The summary last: a long command wraps without pushing the other columns about.
    for (approval_id, tool, since), a in zip(rows, approvals, strict=True):
        print(line.format(approval_id, tool, since, a.get("summary") or ""))


def _print_recordings(body: dict[str, Any]) -> None:
    recordings = body.get("recordings") or []
    if not recordings:
        print("(no recordings)")
        return
    print(f"{'id':23}  {'cli':12}  {'started':24}  {'ended':24}  {'bytes':>10}  markers")
    for r in recordings:
        ended = r.get("ended") or "(recording)"
        print(
            f"{r.get('id')!s:23}  {r.get('cli')!s:12}  {r.get('started')!s:24}  {ended!s:24}  "
            f"{r.get('bytes', 0):>10}  {r.get('markers', 0)}"
        )


def _recordings(client: SidecarClient, args: argparse.Namespace) -> int:
    """Without an id: the list. With one: the file itself on stdout (`| asciinema play -`)."""
    if args.id is None:
        body = client.recordings()
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            _print_recordings(body)
        return 0
    client.recording(args.id, sys.stdout.buffer)
    sys.stdout.buffer.flush()
    return 0


def _print_decided(result: dict[str, Any]) -> None:
    done = {"allow": "allowed", "deny": "denied"}.get(str(result.get("decision")), "answered")
    print(f"{done} {result.get('id')}")


def _print_audit(body: dict[str, Any]) -> None:
    """One line per record: time, type, then its fields (the JSON names them)."""
    records = body.get("records") or []
    if not records:
        print("(no audit records)")
    for r in records:
        rest = {k: v for k, v in r.items() if k not in ("time", "type", "seq", "sleeve")}
        fields = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in rest.items())
        print(f"{r.get('time')}  {r.get('type')}  {fields}")
    if body.get("truncated"):
        print("(more records matched: --limit, --since or --type narrow it)", file=sys.stderr)


def _policy(client: SidecarClient | None, args: argparse.Namespace) -> int:
    """`policy check FILE`: 0 when the file is a valid policy, 2 naming what is wrong. `policy
    test FILE`: the trail's decisions FILE would make differently; 0 none, 1 some, 2 error."""
    from sidecar.policy.load import PolicyError, read_policy
    from sidecar.policy.replay import differences

    try:
        draft = read_policy(args.file)
    except PolicyError as exc:
        print(f"sidecar policy {args.action}: {exc}", file=sys.stderr)
        return 2
    if args.action == "check":
        text = f"{args.file}: {len(draft.rules)} rules, default {draft.default}"
        print(json.dumps({"file": args.file, "rules": len(draft.rules)}) if args.json else text)
        return 0
    assert client is not None
    try:
        records = list(client.audit_all(["approval-resolved"]))
    except ClientError as exc:
        print(f"sidecar policy test: {exc}", file=sys.stderr)
        return 2
    found = differences(draft, records)
    for diff in found:
        if args.json:
            print(json.dumps({"record": diff.record, "then": diff.then, "now": diff.now}))
        else:
            print(diff.line())
    if not args.json:
        print(f"{len(found)} of {len(records)} decisions would be decided differently")
    return 1 if found else 0


def _print_notify_test(body: dict[str, Any]) -> None:
    results = body.get("results") or []
    if not results:
        print("(no notification channel is configured: SIDECAR_NOTIFY_*)")
    for r in results:
        outcome = "ok" if r.get("ok") else "FAILED"
        print(f"{r.get('channel', '?'):8}  {outcome:6}  {r.get('detail')}")


def _attach(env: dict[str, str]) -> int:
    tmux = shutil.which("tmux")
    if tmux is None:
        print("sidecar attach: tmux is not installed", file=sys.stderr)
        return 1
    from sidecar.core.layout import Layout
    from sidecar.security.users import become, parse_user

    state = Path(env.get("SIDECAR_STATE_DIR") or DEFAULT_STATE_DIR)
    # Whether the CLI runs as SIDECAR_USER depends on the sidecar's uid, not this client's (one
    # naming the sidecar's own uid switches nothing): the session dir it then made tells.
    paths = Layout(state, for_user=True)
    if not (env.get("SIDECAR_USER", "").strip() and paths.session_dir.is_dir()):
        paths = Layout(state)
    socket = paths.tmux_socket
    if paths.for_user and os.geteuid() == 0:
        # The session is that user's, and so must this client be: a root tmux client runs
        # whatever the user's server tells it to (`detach-client -E`).
        try:
            become(parse_user(env["SIDECAR_USER"]))
        except (ValueError, OSError) as exc:
            print(f"sidecar attach: SIDECAR_USER: {exc}", file=sys.stderr)
            return 1
    if not socket.exists():
        print(
            f"sidecar attach: no tmux socket at {socket}; is the sidecar running?", file=sys.stderr
        )
        return 1
    os.execv(tmux, [tmux, "-S", str(socket), "attach-session", "-t", TMUX_SESSION])  # noqa: S606 - fixed argv


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sidecar", description="Sleeve sidecar: `sidecar run` (the default) is PID 1."
    )
    p.add_argument("--url", help="API base URL (default: from SIDECAR_HOST/SIDECAR_PORT)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (
        ("status", "show the sleeve's status"),
        ("screen", "print the CLI's screen as text"),
        ("outbox", "list messages from this sleeve"),
        ("inbox", "list messages to this sleeve"),
        ("events", "print the event stream (NDJSON) until interrupted"),
    ):
        sp = sub.add_parser(name, help=text)
        sp.add_argument("--json", action="store_true", help="print JSON")
    sp = sub.add_parser("send", help="put a message into this sleeve's inbox")
    sp.add_argument("content", help="message body (markdown); '-' reads standard input")
    sp.add_argument("--from", dest="sender", default="operator")
    sp.add_argument("--type", default="directive", choices=MESSAGE_TYPES)
    sp.add_argument("--to")
    sp.add_argument("--thread")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("resleeve", help="restart the CLI in place, or swap it with --cli")
    sp.add_argument("--cli", help="CLI to run next (default: the current one)")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("input", help="type text into the CLI (a paste), then Enter")
    sp.add_argument("text", help="the text; '-' reads standard input")
    sp.add_argument("--no-submit", action="store_true", help="do not press Enter after it")
    sp.add_argument("--if-state", action="append", choices=AGENT_STATES, dest="if_state")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("keys", help="press named keys in the CLI")
    sp.add_argument(
        "keys", nargs="+", choices=INPUT_KEYS, metavar="KEY", help=", ".join(INPUT_KEYS)
    )
    sp.add_argument("--if-state", action="append", choices=AGENT_STATES, dest="if_state")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("wait", help="wait until the agent is in a state (exit 1 on timeout)")
    sp.add_argument("--state", action="append", required=True, choices=AGENT_STATES)
    sp.add_argument("--timeout", type=float, help="seconds (default: no limit)")
    sp.add_argument("--json", action="store_true")
    _governance_parsers(sub)
    sp = sub.add_parser("recordings", help="list the recorded CLI runs, or print one by its id")
    sp.add_argument("id", nargs="?", help="a recording's id: its asciicast file on stdout")
    sp.add_argument("--json", action="store_true", help="print the list as JSON")
    sp = sub.add_parser("notify", help="notifications: `notify test` sends one to each channel")
    sp.add_argument("action", choices=["test"])
    sp.add_argument("--json", action="store_true")
    sub.add_parser("attach", help="attach this terminal to the tmux session")
    sub.add_parser("run", help="run the supervisor (the container entrypoint)")
    return p


def _governance_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """approvals, approve, deny, audit, policy: who decides what the agent may do."""
    sp = sub.add_parser("approvals", help="list the permission requests the agent waits on")
    sp.add_argument("--json", action="store_true", help="print JSON")
    sp = sub.add_parser("approve", help="allow one permission request, by its id")
    sp.add_argument("id", help="the request's id (`sidecar approvals`)")
    sp.add_argument(
        "--remember", action="store_true", help="allow this kind of call for the session"
    )
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("deny", help="deny one permission request, by its id")
    sp.add_argument("id", help="the request's id (`sidecar approvals`)")
    sp.add_argument("--message", help="told to the agent (why, or what to do instead)")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("audit", help="print the audit trail (the latest records)")
    sp.add_argument("--since", help="RFC 3339 time: records from then on")
    sp.add_argument("--type", action="append", dest="types", help="a record type (repeatable)")
    sp.add_argument("--limit", type=int, help="at most this many (default 100)")
    sp.add_argument("--json", action="store_true")
    sp = sub.add_parser("policy", help="check a policy file, or test it against the audit trail")
    sp.add_argument("action", choices=("check", "test"), help="check: validate; test: replay")
    sp.add_argument("file", help="the policy file (YAML)")
    sp.add_argument("--json", action="store_true")


def _events(client: SidecarClient, args: argparse.Namespace) -> int:
    for event in client.events():
        print(json.dumps(event), flush=True)
    return 0


def _wait(client: SidecarClient, args: argparse.Namespace) -> int:
    reached = client.wait_state(args.state, args.timeout)
    if args.json:
        print(json.dumps({"reached": reached is not None, "state": reached}))
    elif reached is not None:
        print(reached)
    else:
        print(
            f"sidecar wait: not {' or '.join(args.state)} after {args.timeout} s", file=sys.stderr
        )
    return 0 if reached is not None else 1


def _input(client: SidecarClient, args: argparse.Namespace) -> dict[str, Any]:
    text = sys.stdin.read() if args.text == "-" else args.text
    return client.input_text(text, submit=not args.no_submit, if_state=args.if_state)


def _send(client: SidecarClient, args: argparse.Namespace) -> dict[str, Any]:
    content = sys.stdin.read() if args.content == "-" else args.content
    return client.send(args.sender, args.type, content, args.to, args.thread)


def _print_delivered(result: dict[str, Any]) -> None:
    print(f"delivered; the agent is {result.get('agent')}")


Call = Callable[[SidecarClient, argparse.Namespace], dict[str, Any]]
# Commands that follow the API until done, printing as they go; their exit status.
STREAMS: dict[str, Callable[[SidecarClient, argparse.Namespace], int]] = {
    "events": _events,
    "wait": _wait,
    "policy": _policy,
    "recordings": _recordings,
}
# Commands of one request: the call, and how its answer is printed without --json.
REQUESTS: dict[str, tuple[Call, Callable[[dict[str, Any]], None]]] = {
    "status": (lambda client, _: client.status(), _print_status),
    "screen": (lambda client, _: client.screen(), _print_screen),
    "outbox": (lambda client, _: client.outbox(), _print_messages),
    "inbox": (lambda client, _: client.inbox(), _print_messages),
    "send": (_send, lambda result: print(f"sent {result.get('id')}")),
    "input": (_input, _print_delivered),
    "keys": (lambda client, args: client.keys(args.keys, if_state=args.if_state), _print_delivered),
    "resleeve": (
        lambda client, args: client.resleeve(args.cli),
        lambda result: print(f"resleeving to {result.get('cli')}"),
    ),
    "approvals": (lambda client, _: client.approvals(), _print_approvals),
    "approve": (
        lambda client, args: client.approve(args.id, remember=args.remember),
        _print_decided,
    ),
    "deny": (lambda client, args: client.deny(args.id, message=args.message), _print_decided),
    "audit": (
        lambda client, args: client.audit(since=args.since, types=args.types, limit=args.limit),
        _print_audit,
    ),
    "notify": (lambda client, _: client.notify_test(), _print_notify_test),
}


def client_main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    env = dict(os.environ)
    if args.command == "attach":
        return _attach(env)
    if args.command == "policy" and args.action == "check":
        return _policy(None, args)
    try:
        client = SidecarClient.from_env(env)
        if args.url:
            client = SidecarClient(args.url, client.token)
        stream = STREAMS.get(args.command)
        if stream is not None:
            return stream(client, args)
        call, show = REQUESTS[args.command]
        result = call(client, args)
    except ClientError as exc:
        print(f"sidecar {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    if args.command == "notify" and not all(r.get("ok") for r in result.get("results", [])):
        return 1  # a channel that failed the test fails the command
    return 0
