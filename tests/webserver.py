"""The far end the egress tests allow: a real HTTP server on a free loopback port that answers
every GET with `hello` (the sidecar's proxy, bubblewrap and the image reach it as
`127.0.0.1:PORT`)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.body()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self) -> bytes:
        return b"hello"

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def web_server(handler: type[Hello] = Hello) -> Iterator[int]:
    """The server running (in a thread) while the block runs; its port. `handler`: what
    answers (a Hello that says something else)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
