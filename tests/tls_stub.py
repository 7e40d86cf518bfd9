"""An HTTPS server on 127.0.0.1 for the egress proxy's TLS tests, run as its own process:
`python -m tests.tls_stub CERT KEY SEEN [GIT_ROOT TOKEN]` (CERT and KEY `-`: plain HTTP). It
prints its port, appends each request it reads (method, path, headers, body) to SEEN as a JSON
line, and answers keep-alive HTTP/1.1 (/echo: with the body it read); under /git/ it is `git
http-backend` (smart HTTP) behind Basic auth with TOKEN as the password. Standard library only;
loopback only.
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import ssl
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    seen: Path
    git_root: Path | None = None
    token = ""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b""):
                pass  # trailers
            return b"".join(parts)
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _any(self) -> None:
        if self.headers.get("Expect", "").lower() == "100-continue":
            self.send_response_only(100)
            self.end_headers()
        body = self._body()
        record = {
            "method": self.command,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": body.decode("latin-1"),
        }
        with self.seen.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.path.startswith("/git/") and self.git_root is not None:
            self._git(body)
            return
        if self.path == "/echo":
            self._answer(200, [], body)
            return
        self._answer(200, [], f"seen {self.command} {self.path}\n".encode())

    do_GET = do_POST = do_PUT = _any

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _git(self, body: bytes) -> None:
        kind, _, credentials = self.headers.get("Authorization", "").partition(" ")
        password = ""
        if kind == "Basic":
            password = base64.b64decode(credentials).decode().partition(":")[2]
        if not hmac.compare_digest(password.encode(), self.token.encode()):
            self._answer(401, [("WWW-Authenticate", 'Basic realm="git"')], b"token needed\n")
            return
        path, _, query = self.path.removeprefix("/git").partition("?")
        assert self.git_root is not None
        env = {
            "PATH": os.environ["PATH"],
            "GIT_PROJECT_ROOT": str(self.git_root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": "sleeve",
            "REMOTE_ADDR": "127.0.0.1",
        }
        if self.headers.get("Content-Encoding"):
            env["HTTP_CONTENT_ENCODING"] = self.headers["Content-Encoding"]
        out = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
        ).stdout
        head, _, rest = out.partition(b"\r\n\r\n")
        status, headers = 200, []
        for line in head.decode().split("\r\n"):
            name, _, value = line.partition(": ")
            if name.lower() == "status":
                status = int(value.split()[0])
            elif name:
                headers.append((name, value))
        self._answer(status, headers, rest)


def main() -> None:
    cert, key, seen = sys.argv[1:4]
    Handler.seen = Path(seen)
    if len(sys.argv) > 5:
        Handler.git_root, Handler.token = Path(sys.argv[4]), sys.argv[5]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if cert != "-":  # `-`: plain HTTP
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
