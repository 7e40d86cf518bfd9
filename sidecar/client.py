"""A small synchronous client for the sidecar API, for `docker exec` debugging and for an envoy
written in Python. Standard library only, so it imports fast and anywhere.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

from sidecar.core.contract import DEFAULT_PORT
from sidecar.core.loopback import loopback_url
from sidecar.security import tokens


class ClientError(Exception):
    """The API answered with an error or could not be reached; `status` is 0 for the latter.
    `body`: the error's JSON answer, when it had one (a 409 of an approval names `by`)."""

    def __init__(self, message: str, status: int = 0, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _token(env: Mapping[str, str]) -> str | None:
    """SIDECAR_TOKEN, or the file SIDECAR_TOKEN_FILE names, read with the sidecar's own checks;
    None when neither is set (the API's 401 then says what is missing)."""
    try:
        return tokens.resolve(env, tokens.TOKEN_VAR)
    except tokens.TokenError as exc:
        raise ClientError(str(exc)) from None


class SidecarClient:
    def __init__(self, base_url: str, token: str | None = None, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SidecarClient:
        """The local sidecar, as configured by the same variables the sidecar reads. A token
        file that cannot be used is a ClientError naming it."""
        env = os.environ if env is None else env
        host = env.get("SIDECAR_HOST") or "127.0.0.1"
        port = env.get("SIDECAR_PORT") or DEFAULT_PORT
        return cls(loopback_url(host, port), _token(env))

    def _request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)  # noqa: S310 - http(s) URL we built
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        return urllib.request.urlopen(req, timeout=timeout or self.timeout)  # noqa: S310

    def call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        try:
            with self._request(method, path, body, timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
                message = body.get("error", exc.reason)
            except (ValueError, AttributeError):
                body, message = None, exc.reason
            raise ClientError(f"{method} {path}: {exc.code} {message}", exc.code, body) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ClientError(f"cannot reach the sidecar at {self.base_url}: {reason}") from None

    def health(self) -> dict[str, Any]:
        return dict(self.call("GET", "/health"))

    def status(self) -> dict[str, Any]:
        return dict(self.call("GET", "/status"))

    def screen(self) -> dict[str, Any]:
        """The CLI pane's visible screen: `rows`, `cols`, `lines`, `cursor` {`row`, `col`}."""
        return dict(self.call("GET", "/screen"))

    def outbox(self) -> dict[str, Any]:
        return dict(self.call("GET", "/outbox"))

    def inbox(self) -> dict[str, Any]:
        return dict(self.call("GET", "/inbox"))

    def ack(self, ids: list[str]) -> dict[str, Any]:
        return dict(self.call("POST", "/outbox/ack", {"ids": ids}))

    def send(
        self,
        sender: str,
        type_: str,
        content: str,
        to: str | None = None,
        thread: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"from": sender, "type": type_, "content": content}
        if to:
            body["to"] = to
        if thread:
            body["thread"] = thread
        return dict(self.call("POST", "/inbox", body))

    def resleeve(self, cli: str | None = None) -> dict[str, Any]:
        return dict(self.call("POST", "/resleeve", {"cli": cli} if cli else {}))

    def input_text(
        self, text: str, *, submit: bool = True, if_state: list[str] | None = None
    ) -> dict[str, Any]:
        """Type `text` into the CLI as a paste, then Enter unless `submit` is false."""
        body: dict[str, Any] = {"text": text, "submit": submit}
        if if_state:
            body["if_state"] = if_state
        return dict(self.call("POST", "/input", body))

    def keys(self, keys: list[str], *, if_state: list[str] | None = None) -> dict[str, Any]:
        """Press named keys (Enter, Escape, Up, 1, y, C-c, ...)."""
        body: dict[str, Any] = {"keys": keys}
        if if_state:
            body["if_state"] = if_state
        return dict(self.call("POST", "/input", body))

    def approvals(self) -> dict[str, Any]:
        """The permission requests the agent waits on: `approvals`, each with `id`, `tool`,
        `summary`, `input`, `since`, `source`."""
        return dict(self.call("GET", "/approvals"))

    def approve(self, approval_id: str, *, remember: bool = False) -> dict[str, Any]:
        """Allow one request (`remember`: this kind of call for the rest of the session, where
        the CLI offers it). A ClientError of status 409 says who answered it first."""
        body: dict[str, Any] = {"decision": "allow"}
        if remember:
            body["remember"] = True
        return self._decide(approval_id, body)

    def deny(self, approval_id: str, *, message: str | None = None) -> dict[str, Any]:
        """Deny one request; `message` is told to the agent."""
        body: dict[str, Any] = {"decision": "deny"}
        if message is not None:
            body["message"] = message
        return self._decide(approval_id, body)

    def _decide(self, approval_id: str, body: dict[str, Any]) -> dict[str, Any]:
        # Quoted whole: an id is one path segment, whatever it holds.
        path = "/approvals/" + urllib.parse.quote(approval_id, safe="")
        return dict(self.call("POST", path, body))

    def audit(
        self,
        *,
        since: str | None = None,
        types: list[str] | None = None,
        limit: int | None = None,
        after: int | None = None,
    ) -> dict[str, Any]:
        """Audit records, oldest first: `records`, `truncated` (more matched than `limit`)."""
        query = {
            "since": since,
            "type": ",".join(types) if types else None,
            "limit": limit,
            "after": after,
        }
        given = {k: str(v) for k, v in query.items() if v is not None}
        path = "/audit" + (f"?{urllib.parse.urlencode(given)}" if given else "")
        return dict(self.call("GET", path))

    def audit_all(self, types: list[str], *, pages: int = 100) -> Iterator[dict[str, Any]]:
        """Every audit record of `types`, oldest first, page by page (at most `pages` pages of
        10,000)."""
        after = 0
        for _ in range(pages):
            page = self.audit(types=types, after=after, limit=10_000)
            records = page.get("records") or []
            yield from records
            if not page.get("truncated") or not records:
                return
            after = int(records[-1]["seq"])

    def egress(self) -> dict[str, Any]:
        """The egress allowlist as the proxy applies it now (GET /egress)."""
        return dict(self.call("GET", "/egress"))

    def change_egress(
        self, add: list[str] | None = None, remove: list[str] | None = None
    ) -> dict[str, Any]:
        """Add patterns to the allowlist, or take them off (PATCH /egress)."""
        body = {k: v for k, v in (("add", add), ("remove", remove)) if v}
        return dict(self.call("PATCH", "/egress", body))

    def recordings(self) -> dict[str, Any]:
        """The recorded CLI runs: `recordings`, each with `id`, `cli`, `started`, `ended`,
        `bytes`, `markers`."""
        return dict(self.call("GET", "/recordings"))

    def recording(self, recording_id: str, out: BinaryIO) -> None:
        """Copy one recording (asciicast v2) into `out`."""
        path = "/recordings/" + urllib.parse.quote(recording_id, safe="")
        try:
            with self._request("GET", path) as resp:
                while block := resp.read(1 << 16):
                    out.write(block)
        except urllib.error.HTTPError as exc:
            raise ClientError(f"GET {path}: {exc.code} {exc.reason}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ClientError(f"cannot reach the sidecar at {self.base_url}: {exc}") from None

    def notify_test(self) -> dict[str, Any]:
        """A test notification to each channel: `results`, each `channel`, `ok`, `detail`. One
        try per channel, ~10 s at most."""
        return dict(self.call("POST", "/notify/test", timeout=max(self.timeout, 30.0)))

    def wait_state(self, states: list[str], timeout: float | None = None) -> str | None:
        """Wait until the agent is in one of `states`; its state, or None on timeout. Follows
        /events (no polling): /status once after subscribing, then each agent-state event."""
        deadline = None if timeout is None else time.monotonic() + timeout
        result: list[str] = []

        def follow() -> None:
            for event in self.events():
                if event.get("type") == "heartbeat" and not result:
                    state = self.status().get("agent", {}).get("state")
                    if state in states:
                        result.append(state)
                        return
                    result.append("")  # subscribed and checked: from now on, events only
                elif event.get("type") == "agent-state" and event.get("state") in states:
                    result.append(str(event["state"]))
                    return

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        found = [r for r in result if r]
        return found[0] if found else None

    def events(self) -> Iterator[dict[str, Any]]:
        """The NDJSON event stream, one dict per event, until the server closes it."""
        try:
            resp = self._request("GET", "/events", timeout=3600.0)
        except urllib.error.HTTPError as exc:
            raise ClientError(f"GET /events: {exc.code} {exc.reason}", exc.code) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ClientError(f"cannot reach the sidecar at {self.base_url}: {exc}") from None
        # Read with read1, not line iteration: iterating a chunked response takes a stream
        # that breaks off (no closing chunk) for its regular end.
        pending = b""
        with resp:
            try:
                while chunk := resp.read1(1 << 16):
                    *lines, pending = (pending + chunk).split(b"\n")
                    yield from (json.loads(line) for line in lines if line.strip())
            except (http.client.HTTPException, OSError) as exc:
                # The sidecar went away mid-stream (killed, or it dropped a client too slow).
                msg = f"the event stream from {self.base_url} broke off: {exc!r}"
                raise ClientError(msg) from None
