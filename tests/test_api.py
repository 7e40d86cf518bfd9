"""The HTTP API of a real sidecar: auth, JSON errors, /resleeve, /events and the /terminal proxy
(real ttyd, real tmux pane, real WebSocket clients)."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import aiohttp
import psutil
import pytest

from sidecar.core.loopback import free_port
from sidecar.process.ttyd import WRITER_FLAGS
from tests.harness import Sidecar, bearer, http, py_cli, wait_for, write_cli_config
from tests.proctools import kill_supervisor, pane_text, terminal_clients, tmux

TOKEN = "admin-token-0123456789"
VIEW = "viewer-token-9876543210"


@pytest.fixture
def secured(make_sidecar: Callable[..., Sidecar]) -> Sidecar:
    return make_sidecar(env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}).start()


# ---- auth -----------------------------------------------------------------------------------


def test_health_is_open_and_everything_else_needs_a_token(secured: Sidecar) -> None:
    assert secured.get("/health")[0] == 200
    for path in ("/status", "/outbox", "/inbox", "/openapi.json", "/", "/terminal/"):
        code, body = secured.get(path, headers={})
        assert code == 401, path
        assert "error" in body
    assert secured.post("/resleeve", headers={})[0] == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Token {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {TOKEN}x"},
    ],
)
def test_wrong_tokens_and_schemes_are_refused(secured: Sidecar, headers: dict[str, str]) -> None:
    code, body = secured.get("/status", headers=headers)
    assert code == 401
    assert body["error"]


def test_admin_token_opens_everything(secured: Sidecar) -> None:
    assert secured.get("/status", headers=bearer(TOKEN))[0] == 200
    code, body = secured.post("/resleeve", {}, headers=bearer(TOKEN))
    assert code == 202, body


def test_view_token_reads_but_cannot_mutate(secured: Sidecar) -> None:
    assert secured.get("/status", headers=bearer(VIEW))[0] == 200
    assert secured.get("/outbox", headers=bearer(VIEW))[0] == 200
    for path, body in (
        ("/resleeve", {}),
        ("/inbox", {"from": "x", "type": "task", "content": "y"}),
        ("/outbox/ack", {"ids": []}),
    ):
        code, answer = secured.post(path, body, headers=bearer(VIEW))
        assert code == 403, path
        assert "read-only" in answer["error"]


def test_query_token_sets_an_httponly_strict_cookie_that_works(secured: Sidecar) -> None:
    cookie = http("GET", f"{secured.url}/status?token={TOKEN}").headers["Set-Cookie"]
    assert "sidecar_token=" in cookie
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    value = cookie.split(";")[0]
    assert secured.get("/status", headers={"Cookie": value})[0] == 200
    assert secured.get("/status", headers={"Cookie": "sidecar_token=nope"})[0] == 401


def test_query_token_on_the_streamed_terminal_page_sets_the_cookie_too(secured: Sidecar) -> None:
    """ttyd's page is streamed through the proxy; its own requests (token, WebSocket) carry no
    ?token=, so the cookie must come with the page itself."""
    resp = http("GET", f"{secured.url}/terminal/?token={TOKEN}")
    assert resp.status == 200
    cookie = resp.headers["Set-Cookie"]
    assert cookie is not None
    assert cookie.startswith(f"sidecar_token={TOKEN};")
    assert secured.get("/terminal/token", headers={"Cookie": cookie.split(";")[0]})[0] == 200


# ---- browsers: origin checks ----------------------------------------------------------------


def test_a_cross_origin_browser_request_is_refused(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    before = sc.status()["cli_pid"]
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    code, body = sc.post("/resleeve", raw=b"{}", headers=evil)
    assert code == 403
    assert "cross-origin" in body["error"]
    code, _ = sc.post("/inbox", raw=b'{"from": "x", "type": "task", "content": "rm"}', headers=evil)
    assert code == 403
    assert sc.get("/inbox")[1]["messages"] == []
    assert sc.get("/status", headers={"Origin": "null"})[0] == 403
    assert sc.status()["cli_pid"] == before
    # The page's own origin passes, and so do clients that are not browsers (no Origin).
    own = {"Origin": f"http://127.0.0.1:{sc.port}"}
    assert sc.post("/inbox", {"from": "x", "type": "task", "content": "hi"}, headers=own)[0] == 201
    assert sc.post("/inbox", {"from": "x", "type": "task", "content": "hi"}, headers={})[0] == 201


async def test_a_cross_origin_terminal_websocket_is_refused(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(
                sc.url + "/terminal/ws", protocols=("tty",), origin="http://evil.example"
            )
        assert refused.value.status == 403
        ws = await session.ws_connect(
            sc.url + "/terminal/ws", protocols=("tty",), origin=f"http://127.0.0.1:{sc.port}"
        )
        await ws.close()


def test_without_a_token_browsers_must_use_an_address_not_a_name(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """DNS rebinding: a page on evil.example re-points its name at 127.0.0.1 and is then
    same-origin with us. Without a token only IP addresses and localhost serve browsers."""
    sc = make_sidecar().start()
    rebound = {"Host": f"evil.example:{sc.port}", "Origin": f"http://evil.example:{sc.port}"}
    code, body = sc.post("/resleeve", raw=b"{}", headers=rebound)
    assert code == 403
    assert "SIDECAR_TOKEN" in body["error"]
    fetch = {"Host": f"evil.example:{sc.port}", "Sec-Fetch-Site": "same-origin"}
    assert sc.get("/status", headers=fetch)[0] == 403
    # Not a browser (an envoy reaching the sleeve by its container name): served.
    assert sc.get("/status", headers={"Host": f"sleeve-a:{sc.port}"})[0] == 200
    local = {"Host": f"localhost:{sc.port}", "Origin": f"http://localhost:{sc.port}"}
    assert sc.get("/status", headers=local)[0] == 200


def test_allowed_origins_let_a_reverse_proxy_page_in(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar(
        env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_ALLOWED_ORIGINS": "https://envoy.example"}
    ).start()
    proxied = {**bearer(TOKEN), "Host": "10.1.2.3:8080", "Origin": "https://envoy.example"}
    assert sc.get("/status", headers=proxied)[0] == 200
    other = {**proxied, "Origin": "https://other.example"}
    assert sc.get("/status", headers=other)[0] == 403
    # With a token, a browser may use a name: the token is what keeps other pages out.
    named = {**bearer(TOKEN), "Host": "box.lan:8080", "Origin": "http://box.lan:8080"}
    assert sc.get("/status", headers=named)[0] == 200


# ---- errors and limits ------------------------------------------------------------------------


def test_unknown_route_and_wrong_method_answer_json(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    code, body = sc.get("/nope")
    assert code == 404
    assert body["error"]
    code, body = http("DELETE", sc.url + "/status")
    assert code == 405
    assert body["error"]


def test_oversized_body_is_413(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    code, body = sc.post("/resleeve", raw=b'{"cli": "' + b"x" * (300 * 1024) + b'"}')
    assert code == 413
    assert "limit" in body["error"]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"not json", "JSON"),
        (b"[1, 2]", "object"),
        (b'"shell"', "object"),
        (b'{"cli": 5}', "Expected `str`, got `int` - at `$.cli`"),
        (b'{"cli": ["shell"]}', "Expected `str`, got `array` - at `$.cli`"),
        (b'{"cli": null}', "Expected `str`, got `null` - at `$.cli`"),
        (b'{"cli": ""}', "length >= 1 - at `$.cli`"),
        (b'{"cli": "shell; touch /tmp/pwned"}', "unknown CLI"),
        (b'{"cli": "$(touch /tmp/pwned)"}', "unknown CLI"),
        (b'{"cli": "../../bin/sh"}', "unknown CLI"),
        (b'{"cli": "/bin/sh"}', "unknown CLI"),
        (b'{"cli": "shell", "extra": 1}', "unknown field `extra`"),
    ],
)
def test_resleeve_rejects_bad_bodies_and_runs_nothing(
    make_sidecar: Callable[..., Sidecar], raw: bytes, needle: str
) -> None:
    sc = make_sidecar().start()
    before = sc.status()["cli_pid"]
    code, body = sc.post("/resleeve", raw=raw)
    assert code == 400
    assert needle in body["error"]
    if needle == "unknown CLI":
        assert "shell" in body["error"]  # the answer lists the known names
    assert sc.status()["cli_pid"] == before
    assert not Path("/tmp/pwned").exists()


def test_ten_concurrent_resleeves_give_one_202_and_nine_409(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pid_file = short_tmp / "pf.pid"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"pidfile": py_cli("pidfile.py", str(pid_file))}
    )
    sc = make_sidecar(env_extra={"SIDECAR_CLI_CONFIG": str(config)}).start()
    body = json.dumps({"cli": "pidfile"}).encode()
    auth = "".join(f"{name}: {value}\r\n" for name, value in sc.auth_headers().items())
    head = "POST /resleeve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"{auth}Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    request = head.encode() + body
    # All ten are in the kernel before the sidecar reads one: its supervisor is stopped while
    # the kernel takes each connection and its request. Sent from threads instead, a loaded
    # machine spread them wider than a whole resleeve, and a second one was rightly accepted.
    supervisor = kill_supervisor(sc, signal.SIGSTOP)
    try:
        socks = [socket.create_connection(("127.0.0.1", sc.port), timeout=10) for _ in range(10)]
        for sock in socks:
            sock.sendall(request)
    finally:
        supervisor.send_signal(signal.SIGCONT)
    codes = []
    for sock in socks:
        with sock, sock.makefile("rb") as answer:
            codes.append(int(answer.readline().split()[1]))
    assert sorted(codes) == [202] + [409] * 9
    status = sc.wait_status(
        lambda s: s["cli"] == "pidfile" and s["cli_running"] and not s["resleeving"], "pidfile CLI"
    )
    assert int(wait_for(lambda: pid_file.read_text(), what="pid file")) == status["cli_pid"]


def test_status_shows_a_resleeve_while_it_happens(
    make_sidecar: Callable[..., Sidecar], short_tmp: Path
) -> None:
    pids = short_tmp / "stubborn.pids"
    config = write_cli_config(
        short_tmp / "clis.yaml", {"stubborn": py_cli("stubborn.py", str(pids))}
    )
    sc = make_sidecar(
        cli="stubborn", env_extra={"SIDECAR_CLI_CONFIG": str(config), "SIDECAR_STOP_GRACE": "1"}
    ).start()
    wait_for(pids.exists, what="stubborn ready")
    assert sc.post("/resleeve", {"cli": "shell"})[0] == 202
    during = sc.status()
    assert during["resleeving"] is True
    assert during["cli_state"] == "stopping"
    sc.wait_status(lambda s: not s["resleeving"] and s["cli"] == "shell", "resleeve done")


# ---- events ---------------------------------------------------------------------------------


async def test_200_event_clients_all_receive_the_resleeve_events(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        streams = [await session.get(sc.url + "/events") for _ in range(200)]
        try:
            assert all(r.status == 200 for r in streams)
            # Each stream's first line is a heartbeat: all 200 are subscribed now.
            for r in streams:
                assert json.loads(await r.content.readline())["type"] == "heartbeat"
            assert all(
                r.headers["Content-Type"].startswith("application/x-ndjson") for r in streams
            )
            await asyncio.to_thread(sc.post, "/resleeve", {})

            async def first_two(resp: aiohttp.ClientResponse) -> list[dict[str, object]]:
                events: list[dict[str, object]] = []
                while len(events) < 2:
                    event = json.loads(await resp.content.readline())
                    if event["type"] == "resleeve":  # agent-state events come between
                        events.append(event)
                return events

            got = await asyncio.wait_for(asyncio.gather(*(first_two(r) for r in streams)), 20)
        finally:
            for r in streams:
                r.close()
    for events in got:
        assert [e["type"] for e in events] == ["resleeve", "resleeve"]
        assert [e["phase"] for e in events] == ["started", "done"]


async def test_a_client_that_stops_reading_events_is_dropped_without_growing_memory(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    current = sc.workspace / ".cstack" / "CURRENT.md"
    current.parent.mkdir(parents=True, exist_ok=True)
    assert sc.proc is not None
    supervisor = next(
        p for p in psutil.Process(sc.proc.pid).children() if "sidecar" in " ".join(p.cmdline())
    )
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: no autotuning
    sock.connect(("127.0.0.1", sc.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    rss_before = supervisor.memory_info().rss
    async with aiohttp.ClientSession() as session:
        # Thousands of progress changes (each /status notices one); the client never reads.
        for i in range(6000):
            current.write_text("## Status\nworking\n## Progress\n" + "- [x] a\n" * (1 + i % 2))
            async with session.get(sc.url + "/status") as resp:
                assert resp.status == 200
            if i % 500 == 499 and "dropping an /events subscriber" in sc.log():
                break
    wait_for(
        lambda: "dropping an /events subscriber" in sc.log(), timeout=5, what="slow client dropped"
    )
    assert supervisor.memory_info().rss - rss_before < 30 * 1024 * 1024
    assert sc.get("/health")[0] == 200
    # Dropped means disconnected, not just unsubscribed: EOF once the client reads what was
    # buffered (whether the handler saw the drop or gave up on a write that could not drain).
    await asyncio.wait_for(reader.read(), 30)
    writer.close()


async def test_sigterm_ends_event_streams_and_terminals_and_exits_0_within_grace(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """An open dashboard (an /events stream and a terminal) must not hold up a `docker stop`:
    shutdown ends both and exits 0 within SIDECAR_STOP_GRACE + 1 s."""
    sc = make_sidecar().start()
    assert sc.proc is not None
    grace = float(sc.env()["SIDECAR_STOP_GRACE"])
    async with aiohttp.ClientSession() as session:
        events = await session.get(sc.url + "/events")
        assert json.loads(await events.content.readline())["type"] == "heartbeat"
        term = await connect(session, sc)
        await term.type("echo still-here\r")
        await term.wait_output("still-here")
        started = time.monotonic()
        sc.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(sc.proc.wait, 30)
        elapsed = time.monotonic() - started
        assert code == 0
        assert elapsed < grace + 1, f"shutdown took {elapsed:.1f}s"
        rest = await asyncio.wait_for(events.content.read(), 5)  # then the stream ended
        assert {json.loads(line)["type"] for line in rest.splitlines()} <= {"agent-state"}
        ends = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        for _ in range(1000):  # what was still on its way, then the close
            if (await term.ws.receive(timeout=5)).type in ends:
                break
        else:
            raise AssertionError("the terminal was never closed")


# ---- terminal -------------------------------------------------------------------------------


class Term:
    """A ttyd-protocol WebSocket client (subprotocol `tty`)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        # A bytearray, searched only where it grew: a flood of output arrives as thousands of
        # frames, and re-copying and re-scanning all of it per frame made a waiting test
        # quadratic (minutes, on a loaded machine).
        self.output = bytearray()

    async def init(self) -> None:
        await self.ws.send_str(json.dumps({"AuthToken": "", "columns": 120, "rows": 40}))

    async def type(self, text: str) -> None:
        await self.ws.send_bytes(b"0" + text.encode())

    async def wait_output(self, needle: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        want, start = needle.encode(), 0
        while self.output.find(want, start) < 0:
            start = max(len(self.output) - len(want) + 1, 0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{needle!r} not seen; got {bytes(self.output[-500:])!r}")
            msg = await self.ws.receive(timeout=remaining)
            if msg.type is aiohttp.WSMsgType.BINARY and msg.data[:1] == b"0":
                self.output += msg.data[1:]
            elif msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.ERROR,
            ):
                raise AssertionError(f"closed while waiting for {needle!r}")


async def connect(
    session: aiohttp.ClientSession,
    sc: Sidecar,
    path: str = "/terminal/ws",
    token: str | None = None,
) -> Term:
    headers = bearer(token) if token else {}
    ws = await session.ws_connect(sc.url + path, protocols=("tty",), headers=headers)
    assert ws.protocol == "tty"
    term = Term(ws)
    await term.init()
    return term


@pytest.mark.parametrize("path", ["/terminal/ws", "/terminal"])
async def test_terminal_shows_pane_output_and_takes_writer_input(
    make_sidecar: Callable[..., Sidecar], path: str
) -> None:
    sc = make_sidecar().start()
    marker = uuid.uuid4().hex[:12]
    async with aiohttp.ClientSession() as session:
        term = await connect(session, sc, path)
        await term.type(f"echo typed-{marker}\r")
        await term.wait_output(f"typed-{marker}")
        wait_for(lambda: f"typed-{marker}" in pane_text(sc), what="input reached the pane")
        tmux(sc, "send-keys", "-t", "main", f"echo printed-{marker.upper()}", "Enter")
        await term.wait_output(f"printed-{marker.upper()}")
    # A browser's size never reshapes the CLI's window.
    assert (
        tmux(sc, "display-message", "-p", "-t", "main", "#{window_width}x#{window_height}").strip()
        == "200x50"
    )


async def test_viewer_sees_output_but_its_input_never_reaches_the_pane(secured: Sidecar) -> None:
    marker = uuid.uuid4().hex[:12]
    async with aiohttp.ClientSession() as session:
        viewer = await connect(session, secured, token=VIEW)
        writer = await connect(session, secured, token=TOKEN)
        await viewer.type(f"echo viewer-{marker}\r")
        # Its own view's size (a narrower one: the lines' starts stay in view).
        await viewer.ws.send_bytes(b"1" + json.dumps({"columns": 120, "rows": 50}).encode())
        await writer.type(f"echo writer-{marker}\r")
        await viewer.wait_output(f"writer-{marker}")  # the viewer watches the writer's typing
        await writer.wait_output(f"writer-{marker}")
    text = pane_text(secured)
    assert f"writer-{marker}" in text
    assert f"viewer-{marker}" not in text
    assert "view-only" in secured.log()
    # Its view's size (allowed: its client ignores size) never reshapes the CLI's window.
    size = tmux(secured, "display-message", "-p", "-t", "main", "#{window_width}x#{window_height}")
    assert size.strip() == "200x50"


async def test_terminal_needs_a_token_when_one_is_set(secured: Sidecar) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await session.ws_connect(secured.url + "/terminal/ws", protocols=("tty",))
    assert info.value.status == 401


async def test_a_client_that_never_sends_init_is_closed(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(sc.url + "/terminal/ws", protocols=("tty",))
        started = time.monotonic()
        while True:
            msg = await ws.receive(timeout=20)
            if msg.type in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
                aiohttp.WSMsgType.CLOSING,
            ):
                break
        assert time.monotonic() - started < 15
    assert sc.get("/health")[0] == 200


async def test_a_long_line_typed_right_after_init_reaches_the_shell_whole(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """ttyd starts `tmux attach` on the init message, and until the tmux server has made that
    pty raw, what ttyd writes into it is edited by the kernel's canonical line discipline: a
    line longer than 4095 bytes loses its end (and ^C is a signal, \\r becomes \\n). The proxy
    holds a client's frames until ttyd's first output, which tmux writes only once the pty is
    raw. Without that, 29 of 30 fresh connections lost the end of this line."""
    sc = make_sidecar().start()
    await asyncio.to_thread(wait_for, lambda: pane_text(sc).strip(), what="the shell's prompt")
    async with aiohttp.ClientSession() as session:
        for _ in range(10):  # fresh connections: each one's tmux attach races its input
            marker = uuid.uuid4().hex[:12]
            ws = await session.ws_connect(sc.url + "/terminal/ws", protocols=("tty",))
            term = Term(ws)
            await ws.send_str(json.dumps({"AuthToken": "", "columns": 200, "rows": 50}))
            # Typed at once, right behind the init message. The prompt it sets appears only
            # when the shell has run all of it and reads the next line (so the next round's
            # line cannot meet the pane's own tty between two prompts).
            await term.type(f': {"x" * 5000}; PS1="ok-$((40+2))-{marker}> "\r')
            await term.wait_output(f"ok-42-{marker}> ")
            await ws.close()


def find_ttyd_credential(sc: Sidecar) -> tuple[int, str] | None:
    """The running ttyd's pid and `--credential` (user:password), read from
    /proc/<pid>/cmdline; None while no ttyd runs."""
    assert sc.proc is not None
    for child in psutil.Process(sc.proc.pid).children(recursive=True):
        try:
            argv = Path(f"/proc/{child.pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "--credential" in argv and str(sc.ttyd_port) in argv:
            return child.pid, argv[argv.index("--credential") + 1]
    return None


def ttyd_credential(sc: Sidecar) -> tuple[int, str]:
    found = find_ttyd_credential(sc)
    assert found is not None, "ttyd is not running"
    return found


async def wait_attached(sc: Sidecar) -> None:
    """Until ttyd's `tmux attach` is a client of the session: keys typed before it has put its
    terminal into raw mode are the kernel line discipline's (echoed at once, edited, a long
    line cut short). The proxy holds them until then; a client of ttyd itself must wait."""

    await asyncio.to_thread(wait_for, lambda: terminal_clients(sc), what="a tmux client")


def basic(credential: str) -> str:
    return base64.b64encode(credential.encode()).decode()


async def connect_to_ttyd_directly(
    session: aiohttp.ClientSession,
    sc: Sidecar,
    headers: dict[str, str],
    auth_token: str,
    flags: str = WRITER_FLAGS,
) -> tuple[str, Term | None]:
    """A WebSocket to ttyd's own port, as any web page or local user could open one, with
    ttyd's init message and the tmux client's flags in the URL, as the proxy gives them.
    Returns how the handshake went and, if it passed, the client."""
    try:
        ws = await session.ws_connect(
            f"ws://127.0.0.1:{sc.ttyd_port}/terminal/ws",
            protocols=("tty",),
            headers=headers,
            params={"arg": flags},
        )
    except aiohttp.ClientError as exc:
        return f"refused ({type(exc).__name__})", None
    await ws.send_str(json.dumps({"AuthToken": auth_token, "columns": 120, "rows": 40}))
    return "open", Term(ws)


async def test_ttyd_serves_nothing_without_its_credential(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """With TTYD_PORT, ttyd listens on the host's loopback: a page in the user's browser or
    another local user can reach its port. Without the per-start credential that only the proxy
    holds, HTTP answers 401 and a WebSocket gets no terminal."""
    sc = make_sidecar(ttyd_port=free_port()).start()
    _, credential = ttyd_credential(sc)
    user, password = credential.split(":", 1)
    assert user == "sidecar"
    assert len(password) >= 32
    direct = f"http://127.0.0.1:{sc.ttyd_port}/terminal"
    for path in ("/", "/token"):
        assert http("GET", direct + path)[0] == 401, path
        wrong = {"Authorization": f"Basic {basic('sidecar:guess')}"}
        assert http("GET", direct + path, headers=wrong)[0] == 401, path
    headers = {"Authorization": f"Basic {basic(credential)}"}
    marker = uuid.uuid4().hex[:12]
    async with aiohttp.ClientSession() as session:
        # Without the Basic header the handshake itself is refused.
        how, term = await connect_to_ttyd_directly(session, sc, {}, "")
        assert term is None, how
        # With the header, the init message must carry the credential as well: closed with
        # 1008 (policy violation) before any output.
        how, term = await connect_to_ttyd_directly(session, sc, headers, "")
        assert term is not None, how
        msg = await term.ws.receive(timeout=10)
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        assert term.ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
        # The control: with both (what the proxy sends), the same client gets the pane.
        how, term = await connect_to_ttyd_directly(session, sc, headers, basic(credential))
        assert term is not None, how
        await wait_attached(sc)
        await term.type(f"echo direct-{marker}\r")
        await term.wait_output(f"direct-{marker}")
        await term.ws.close()
    log = sc.log()
    assert password not in log
    assert basic(credential) not in log


def test_the_terminal_page_gets_an_empty_token_never_ttyds_credential(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """ttyd's /token answers its credential (TTYD_PORT mode): the proxy answers the page's
    request itself, for every spelling ttyd would take for /token, for the admin and the view
    token alike."""
    secured = make_sidecar(
        ttyd_port=free_port(), env_extra={"SIDECAR_TOKEN": TOKEN, "SIDECAR_VIEW_TOKEN": VIEW}
    ).start()
    _, credential = ttyd_credential(secured)
    secrets = (credential.split(":", 1)[1], basic(credential))
    for token in (TOKEN, VIEW):
        code, body = secured.get("/terminal/token", headers=bearer(token))
        assert (code, body) == (200, {"token": ""})
        for path in (
            "/terminal/token?x=1",
            "/terminal/%74oken",
            "/terminal//token",
            "/terminal/./token",
            "/terminal/x/../token",
            "/terminal/%2e/token",
            "/terminal/token;x",
        ):
            code, body = secured.get(path, headers=bearer(token))
            text = body.decode(errors="replace") if isinstance(body, bytes) else json.dumps(body)
            assert code in (200, 404), (path, code)
            assert not any(secret in text for secret in secrets), path
    # The page itself still comes through (the proxy authenticates to ttyd).
    assert secured.get("/terminal/", headers=bearer(VIEW))[0] == 200


@pytest.mark.parametrize(
    ("role", "junk"),
    [(TOKEN, b"0echo junk-MARK\r"), (TOKEN, b'["junk-MARK"]'), (VIEW, b"0echo junk-MARK\r")],
)
async def test_a_first_frame_that_is_not_the_init_message_is_refused(
    secured: Sidecar, role: str, junk: bytes
) -> None:
    """The first frame must be ttyd's JSON init object: anything else closes the client at
    once (a viewer too: a junk frame used to switch its init timeout off), and none of it
    reaches ttyd or the pane."""
    marker = uuid.uuid4().hex[:12]
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(
            secured.url + "/terminal/ws", protocols=("tty",), headers=bearer(role)
        )
        await ws.send_bytes(junk.replace(b"MARK", marker.encode()))
        msg = await ws.receive(timeout=5)  # well within the 10 s init timeout
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        assert ws.close_code == aiohttp.WSCloseCode.POLICY_VIOLATION
        # Ordered after it: a writer types a second marker, which the pane shows.
        writer = await connect(session, secured, token=TOKEN)
        await wait_attached(secured)
        await writer.type(f"echo after-{marker}\r")
        await writer.wait_output(f"after-{marker}")
    wait_for(lambda: f"after-{marker}" in pane_text(secured), what="the writer's input")
    assert f"junk-{marker}" not in pane_text(secured)
    assert "not ttyd's JSON init" in secured.log()


async def test_a_restarted_ttyd_has_a_new_credential_and_the_proxy_follows(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(ttyd_port=free_port()).start()
    pid, first = ttyd_credential(sc)
    psutil.Process(pid).kill()
    pid_after, second = wait_for(
        lambda: (found := find_ttyd_credential(sc)) and found[0] != pid and found,
        what="a new ttyd",
    )
    assert second != first
    sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd running again")
    marker = uuid.uuid4().hex[:12]
    async with aiohttp.ClientSession() as session:
        ws = await session.ws_connect(sc.url + "/terminal/ws", protocols=("tty",))
        term = Term(ws)
        # As ttyd's page does it: a binary frame, with the empty token from /terminal/token.
        await ws.send_bytes(json.dumps({"AuthToken": "", "columns": 120, "rows": 40}).encode())
        await wait_attached(sc)
        await term.type(f"echo again-{marker}\r")
        await term.wait_output(f"again-{marker}")
    assert ttyd_credential(sc) == (pid_after, second)


async def test_flooding_input_and_a_stalled_reader_do_not_hurt_the_sidecar(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar().start()
    assert sc.proc is not None
    supervisor = next(
        p for p in psutil.Process(sc.proc.pid).children() if "sidecar" in " ".join(p.cmdline())
    )
    rss_before = supervisor.memory_info().rss
    tmux(sc, "send-keys", "-t", "main", "cat > /dev/null", "Enter")
    async with aiohttp.ClientSession() as session:
        flooder = await connect(session, sc)
        staller = await connect(session, sc)  # never reads another frame
        line = b"0" + b"#" * 1023 + b"\r"
        for _ in range(2048):  # 2 MiB of input, as fast as the proxy takes it
            await flooder.ws.send_bytes(line)
        await flooder.type("\x03")
        # Once the ^C has ended `cat`, the shell reads again. (Typed sooner, a line races the
        # ^C: the tty discards whatever input is queued when it turns ^C into SIGINT.)
        await asyncio.to_thread(
            wait_for,
            lambda: (
                tmux(sc, "display-message", "-p", "-t", "main", "#{pane_current_command}")
                .strip()
                .endswith("bash")
            ),
            30,
            what="the flood's cat ended by ^C",
        )
        # Output the stalled reader never reads: 20 MB through the pane, then a marker.
        marker = uuid.uuid4().hex[:10]
        await flooder.type(f"yes | head -c 20000000; echo done-{marker}\r")
        assert (await asyncio.to_thread(sc.get, "/health"))[0] == 200
        await flooder.wait_output(f"done-{marker}", timeout=60)
        assert supervisor.memory_info().rss - rss_before < 60 * 1024 * 1024
        await staller.ws.close()


def test_terminal_is_503_with_a_reason_while_ttyd_is_down(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    sc = make_sidecar(ttyd_port=free_port())
    # Hold ttyd's port (bound, not listening): ttyd cannot start, connections are refused.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", sc.ttyd_port))
        sc.start(wait_healthy=False)
        code, body = sc.get("/terminal/")
        assert code == 503
        assert "terminal unavailable" in body["error"]
        status = sc.wait_status(lambda s: s["ttyd_state"] == "backoff", "ttyd in backoff")
        assert any(f"TTYD_PORT {sc.ttyd_port} is in use" in w for w in status["warnings"])
    # Port free again: ttyd comes back by itself.
    sc.wait_status(lambda s: s["ttyd_state"] == "running", "ttyd recovered", timeout=15)
    assert sc.get("/terminal/")[0] == 200


def test_terminal_is_usable_as_soon_as_health_says_healthy(
    make_sidecar: Callable[..., Sidecar],
) -> None:
    """A client that opens the terminal the moment the sleeve is healthy gets it: ttyd starts
    beside the CLI, and /terminal waits (bounded) for a ttyd that is still starting."""
    sc = make_sidecar().start(wait_healthy=False)
    wait_for(
        lambda: sc.get("/health")[1]["status"] == "healthy",
        interval=0.002,  # the polling interval of a deadline wait: catch the first healthy answer
        what="healthy",
    )
    code, body = sc.get("/terminal/")
    assert code == 200, body
    assert b"<html" in body.lower()


def test_openapi_describes_every_route(make_sidecar: Callable[..., Sidecar]) -> None:
    sc = make_sidecar().start()
    code, spec = sc.get("/openapi.json")
    assert code == 200
    assert spec["openapi"].startswith("3.")
    for path in (
        "/health",
        "/status",
        "/outbox",
        "/outbox/ack",
        "/inbox",
        "/resleeve",
        "/events",
        "/terminal",
        "/",
        "/openapi.json",
    ):
        assert path in spec["paths"], path
