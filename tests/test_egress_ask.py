"""Egress approvals in a real sidecar: the CLI (a login shell inside the egress guard) runs curl
through the proxy for a host off the list with `SIDECAR_EGRESS_ASK=10`. The request is held and
listed (kind `egress`, the process that asked as the kernel tells it); allow with `remember`
lets it through and puts the host on the list; deny answers a 403 the agent can read; a rule
of the policy decides without anyone asked; `PATCH /egress` changes the list live and closes a
tunnel to a host it removes; a request whose client went away is withdrawn; 500 clients asking
for 500 hosts at once are bounded. Loopback only: the "hosts" are servers on 127.0.0.x."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from sidecar.core.loopback import free_port
from tests.agenttools import EventLog
from tests.harness import Sidecar, http, wait_for
from tests.webserver import web_server

pytestmark = [pytest.mark.slow, pytest.mark.needs("curl"), pytest.mark.timeout(180)]
POLICY = """\
rules:
  - name: by-name
    match: {kind: egress, host: 'localhost:PORT'}
    action: allow
  - name: not-that-port
    match: {kind: egress, host: '127.0.0.1:SHUT'}
    action: deny
    message: that port is off limits for this task
"""


def proxy_port(sc: Sidecar) -> int:
    return int(json.loads((sc.state_dir / "supervisor.json").read_text())["egress_port"])


def curl(sc: Sidecar, url: str, name: str) -> None:
    """Type a curl through the proxy into the CLI's shell: its status, body and start time go
    to files `name`.code, `name`.body and `name`.t in the workspace."""
    line = (
        f"date +%s.%N > {name}.t; curl -sS -m 30 --noproxy '' -x \"$HTTP_PROXY\" "
        f"-o {name}.body -w '%{{http_code}}' {url} > {name}.part; mv {name}.part {name}.code"
    )
    assert sc.post("/input", {"text": line}).status == 202


def result(sc: Sidecar, name: str, timeout: float = 20) -> tuple[str, bytes]:
    code = wait_for(
        lambda: (sc.workspace / f"{name}.code").read_text(), timeout, what=f"curl {name}"
    )
    return code, (sc.workspace / f"{name}.body").read_bytes()


@pytest.fixture
def site() -> Iterator[int]:
    """A web server on 127.0.0.1; `127.0.0.1:port` and `localhost:port` are two hosts to the
    list and the policy."""
    with web_server() as port:
        yield port


@pytest.fixture
def shut() -> int:
    """A port nothing listens on: requests for it are refused before any connect."""
    return free_port()


@pytest.fixture
def asking(
    make_sidecar: Callable[..., Sidecar], tmp_path: Path, site: int, shut: int
) -> Iterator[Sidecar]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("PORT", str(site)).replace("SHUT", str(shut)))
    sc = make_sidecar(
        env_extra={
            "SIDECAR_EGRESS_ALLOW": "127.0.0.1:1",
            "SIDECAR_EGRESS_ASK": "10",
            "SIDECAR_POLICY_FILE": str(policy),
        }
    )
    sc.workspace.mkdir(parents=True, exist_ok=True)
    yield sc.start()


def test_a_held_request_is_listed_allowed_remembered_and_another_denied(
    asking: Sidecar, site: int, shut: int
) -> None:
    sc, port = asking, site
    events = EventLog(sc)
    curl(sc, f"http://127.0.0.1:{port}/first", "one")
    requested = events.wait(lambda e: e["type"] == "approval-requested", "listed", 20)
    started = float((sc.workspace / "one.t").read_text())
    listed_at = time.mktime(time.strptime(requested["time"][:19], "%Y-%m-%dT%H:%M:%S"))
    listed_at += float(requested["time"][19:-1] or 0) - time.timezone
    assert listed_at - started < 0.5, (listed_at, started)
    assert (requested["kind"], requested["tool"]) == ("egress", "egress")
    assert requested["summary"] == f"GET http://127.0.0.1:{port}/first"
    [item] = sc.get("/approvals").body["approvals"]
    asked = item["input"]
    assert (item["kind"], item["source"], item["rule"]) == ("egress", "proxy", "default")
    assert (asked["host"], asked["port"], asked["how"], asked["method"]) == (
        "127.0.0.1", port, "proxy", "GET",
    )  # fmt: skip
    # The process that asked, as the kernel tells it: curl, a child of the CLI's shell.
    assert asked["exe"].endswith("/curl") and asked["argv"][0] == "curl", asked
    assert psutil.Process(asked["pid"]).parent().pid == sc.status()["cli_pid"] or (
        "bash" in psutil.Process(asked["pid"]).parent().name()
    )
    reply = sc.post(f"/approvals/{item['id']}", {"decision": "allow", "remember": True})
    assert reply.status == 200, reply.body
    assert result(sc, "one") == ("200", b"hello")
    changed = events.wait(lambda e: e["type"] == "egress-changed", "egress-changed")
    assert (changed["by"], changed["added"]) == ("approval", [f"127.0.0.1:{port}"])
    egress = sc.get("/egress").body
    assert egress["added"] == [f"127.0.0.1:{port}"] and egress["asked"] == 1
    assert f"127.0.0.1:{port}" in egress["allow"]

    # Remembered: the same host again goes through with nobody asked.
    curl(sc, f"http://127.0.0.1:{port}/second", "two")
    assert result(sc, "two") == ("200", b"hello")
    assert len(events.of("approval-requested")) == 1

    # A rule of the policy allows another one: nobody asked, `by: policy`.
    curl(sc, f"http://localhost:{port}/", "three")
    assert result(sc, "three") == ("200", b"hello")
    by_rule = events.wait(
        lambda e: e["type"] == "approval-resolved" and e.get("by") == "policy", "policy"
    )
    assert (by_rule["decision"], by_rule["rule"], by_rule["kind"]) == (
        "allow", "by-name", "egress",
    )  # fmt: skip
    assert len(events.of("approval-requested")) == 1

    # A rule denies: a 403 whose JSON body carries the rule's message.
    curl(sc, f"http://127.0.0.1:{shut}/", "four")
    code, body = result(sc, "four")
    refused = json.loads(body)
    assert code == "403"
    assert (refused["host"], refused["port"]) == ("127.0.0.1", shut)
    assert refused["reason"] == "that port is off limits for this task"
    assert "not on the egress allowlist" in refused["error"] and refused["next"]

    # A person denies: the same body, with the person's message.
    other = free_port()
    curl(sc, f"http://127.0.0.1:{other}/", "five")
    asked_again = wait_for(lambda: sc.get("/approvals").body["approvals"], 20, what="listed")
    why = "Not this one: use the mirror instead."
    deny = {"decision": "deny", "message": why}
    assert sc.post(f"/approvals/{asked_again[0]['id']}", deny).status == 200
    code, body = result(sc, "five")
    assert code == "403" and json.loads(body)["reason"] == why

    records = sc.get("/audit?type=egress-connection&limit=50").body["records"]
    allowed = [r for r in records if r["allowed"]]
    assert {r["rule"] for r in allowed} >= {f"approval:{item['id']}", f"127.0.0.1:{port}",
                                            "policy:by-name"}  # fmt: skip
    first = next(r for r in allowed if r["rule"] == f"approval:{item['id']}")
    assert first["bytes_in"] > len(b"hello") and first["bytes_out"] > 0
    assert first["exe"].endswith("/curl") and first["pid"] == asked["pid"]
    assert [r["reason"] for r in records if not r["allowed"]][-2:] == [
        f"127.0.0.1:{shut} is not on the egress allowlist (SIDECAR_EGRESS_ALLOW): "
        "that port is off limits for this task",
        f"127.0.0.1:{other} is not on the egress allowlist (SIDECAR_EGRESS_ALLOW): {why}",
    ]
    resolved = sc.get("/audit?type=approval-resolved").body["records"]
    assert [(r["by"], r["decision"]) for r in resolved] == [
        ("api", "allow"), ("policy", "allow"), ("policy", "deny"), ("api", "deny"),
    ]  # fmt: skip


def test_nobody_answering_in_time_is_a_403_saying_so(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(env_extra={"SIDECAR_EGRESS_ALLOW": "none", "SIDECAR_EGRESS_ASK": "1"})
    sc.workspace.mkdir(parents=True, exist_ok=True)
    sc.start()
    with web_server() as port:
        curl(sc, f"http://127.0.0.1:{port}/", "late")
        code, body = result(sc, "late")
    assert code == "403"
    assert (
        "Nobody answered this permission request within 1 s (SIDECAR_EGRESS_ASK)"
        in (json.loads(body)["reason"])
    )
    assert sc.get("/audit?type=approval-resolved").body["records"][0]["by"] == "timeout"


def test_a_removed_hosts_open_tunnel_is_closed(asking: Sidecar) -> None:
    """The tunnel is the test's own (the proxy takes any loopback client alike)."""
    sc = asking
    echo = socket.create_server(("127.0.0.1", 0))
    far = echo.getsockname()[1]

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = echo.accept()
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    pattern = f"127.0.0.1:{far}"
    added = http("PATCH", sc.url + "/egress", {"add": [pattern]})
    assert added.status == 200 and pattern in added.body["allow"], added.body
    with socket.create_connection(("127.0.0.1", proxy_port(sc)), timeout=10) as tunnel:
        tunnel.sendall(f"CONNECT {pattern} HTTP/1.1\r\n\r\n".encode())
        assert tunnel.recv(4096).startswith(b"HTTP/1.1 200")
        tunnel.sendall(b"ping")
        assert tunnel.recv(4) == b"ping"
        removed = http("PATCH", sc.url + "/egress", {"remove": [pattern]})
        assert removed.status == 200 and pattern not in removed.body["allow"]
        tunnel.settimeout(10)
        assert tunnel.recv(4096) == b""  # closed by the proxy
    echo.close()
    changes = sc.get("/audit?type=egress-changed").body["records"]
    assert [(c["added"], c["removed"]) for c in changes] == [([pattern], []), ([], [pattern])]


@pytest.mark.parametrize(
    "pattern",
    ["*", "http://x", "a" * 2048 + ".example", "a\x00b.example", "10.0.0.0/8", "x.example:0"],
)
def test_patch_egress_refuses_what_is_not_a_pattern_and_changes_nothing(
    asking: Sidecar, pattern: str
) -> None:
    before = asking.get("/egress").body
    reply = http("PATCH", asking.url + "/egress", {"add": ["fine.example", pattern]})
    assert reply.status == 400, reply.body
    assert "nothing was changed" in reply.body["error"]
    assert asking.get("/egress").body == before
    gone = http("PATCH", asking.url + "/egress", {"remove": ["not-listed.example"]})
    assert gone.status == 400 and "not on the list" in gone.body["error"]


def test_an_answer_after_the_client_went_away_is_409(asking: Sidecar) -> None:
    sc = asking
    client = socket.create_connection(("127.0.0.1", proxy_port(sc)), timeout=10)
    client.sendall(b"CONNECT gone.example:443 HTTP/1.1\r\n\r\n")
    [item] = wait_for(lambda: sc.get("/approvals").body["approvals"], 10, what="listed")
    client.close()
    wait_for(lambda: not sc.get("/approvals").body["approvals"], 10, what="withdrawn")
    late = sc.post(f"/approvals/{item['id']}", {"decision": "allow"})
    assert late.status == 409, late.body
    assert late.body["decision"] is None
    assert late.body["reason"] == "the client that asked went away"
    resolved = sc.get("/audit?type=approval-resolved").body["records"][-1]
    assert (resolved["id"], resolved["reason"]) == (item["id"], "the client that asked went away")


def test_500_clients_asking_for_500_hosts_at_once_are_bounded(asking: Sidecar) -> None:
    """32 approvals wait at once; the other requests are refused at once, saying why; the
    supervisor's memory stays put; every held one is refused when nobody answers in time."""
    sc = asking
    supervisor = psutil.Process(sc.proc.pid).children()[0]  # type: ignore[union-attr]
    before = supervisor.memory_info().rss
    port = proxy_port(sc)
    answers: dict[int, bytes] = {}
    with selectors.DefaultSelector() as selector:
        clients = []
        for n in range(500):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(f"CONNECT host-{n}.example:443 HTTP/1.1\r\n\r\n".encode())
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ, n)
            clients.append(s)
        try:
            listed = wait_for(
                lambda: len(sc.get("/approvals").body["approvals"]) == 32, 30, what="32 listed"
            )
            grown = supervisor.memory_info().rss - before
            deadline = time.monotonic() + 60
            while len(answers) < 500 and time.monotonic() < deadline:
                for key, _ in selector.select(1.0):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    answers[key.data] = answers.get(key.data, b"") + sock.recv(65536)
                    if answers[key.data].endswith(b"}\n"):
                        selector.unregister(sock)
        finally:
            for s in clients:
                s.close()
    assert listed and grown < 16 * 1024 * 1024, grown
    reasons = [json.loads(a.partition(b"\r\n\r\n")[2])["reason"] for a in answers.values()]
    assert len(reasons) == 500
    assert all(a.startswith(b"HTTP/1.1 403 ") for a in answers.values())
    crowded = [r for r in reasons if "already wait for a person's answer" in r]
    late = [r for r in reasons if "within 10 s (SIDECAR_EGRESS_ASK)" in r]
    assert (len(crowded), len(late)) == (468, 32)
    assert sc.get("/approvals").body["approvals"] == []


def test_a_connection_around_the_proxy_is_refused_at_once_and_the_event_says_why(
    asking: Sidecar,
) -> None:
    sc = asking
    events = EventLog(sc)
    with web_server() as port:
        line = f"curl -sS -m 5 --noproxy '*' http://127.0.0.1:{port}/ ; echo $? > direct.code"
        assert sc.post("/input", {"text": line}).status == 202
        wait_for(lambda: (sc.workspace / "direct.code").read_text().strip(), 20, what="curl")
    denied = events.wait(
        lambda e: e["type"] == "egress-denied" and e["how"] == "direct", "egress-denied"
    )
    assert "cannot be held safely" in denied["reason"]
    assert sc.get("/approvals").body["approvals"] == []
