"""A small stand-in for the Anthropic API on 127.0.0.1, so the real Claude Code CLI runs offline.

It answers `HEAD /api/hello` (the CLI's connectivity probe) and `POST /v1/messages` - streamed
as server-sent events in the Messages API shape when the request asks for `stream`, plain JSON
otherwise - and records every request, headers too, so a test can see what the CLI sent. This is
the one fake in the end-to-end tests: the network seam, no real API is reachable from here.

With `bash_command` set, a streamed request that offers the Bash tool and ends with the user's
own text is answered with a Bash `tool_use` running that command (so the CLI asks permission
for it), and the request that carries its `tool_result` with the text reply and `end_turn`: one
prompt, one tool call, one answer (`bash_calls`: that many calls in a row before the answer).

With `usage`, every answer reports those token counts (`input_tokens`, `output_tokens`,
`cache_read_input_tokens`, `cache_creation_input_tokens`), and `reported` lists what each
answer reported, as a client sums it: the start's input and cache counts, the end's output.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.aioserver import ThreadedApp

REPLY_TEXT = "Hello from the sleeve test stub."


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    body: Any
    time: float = field(default_factory=time.monotonic)
    headers: dict[str, str] = field(default_factory=dict)  # names lowercased


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class AnthropicStub:
    """Runs an aiohttp app on its own event loop in a thread; `url` is set once it listens."""

    def __init__(
        self,
        reply: str = REPLY_TEXT,
        bash_command: str | None = None,
        bash_calls: int = 1,
        usage: dict[str, int] | None = None,
        ssl_context: ssl.SSLContext | None = None,  # served over TLS with it
    ) -> None:
        self.reply = reply
        self.bash_command = bash_command
        self.bash_calls = bash_calls
        self.usage = usage
        self.reported: list[dict[str, int]] = []
        self.url = ""
        self._requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._server = ThreadedApp(ssl_context=ssl_context)
        self._tool_uses = 0

    # --- recording ---------------------------------------------------------------------------
    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def messages_posts(self) -> list[Recorded]:
        return [r for r in self.requests if r.method == "POST" and r.path == "/v1/messages"]

    def tool_results(self) -> list[str]:
        """Text of every `tool_result` the CLI sent back (what the tool printed), in order."""
        found: list[str] = []
        for rec in self.messages_posts():
            for msg in (rec.body or {}).get("messages", []):
                content = msg.get("content")
                for block in content if isinstance(content, list) else []:
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        inner = block.get("content")
                        if isinstance(inner, list):
                            inner = "".join(c.get("text", "") for c in inner if isinstance(c, dict))
                        found.append(str(inner))
        return found

    def prompts_seen(self) -> list[str]:
        """Text of every user message the CLI sent, in order."""
        texts: list[str] = []
        for rec in self.messages_posts():
            for msg in (rec.body or {}).get("messages", []):
                content = msg.get("content")
                if isinstance(content, str):
                    texts.append(content)
                elif isinstance(content, list):
                    texts.extend(c.get("text", "") for c in content if isinstance(c, dict))
        return texts

    # --- handlers ----------------------------------------------------------------------------
    async def _record(self, request: web.Request) -> Any:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with self._lock:
            headers = {k.lower(): v for k, v in request.headers.items()}
            self._requests.append(Recorded(request.method, request.path, body, headers=headers))
        return body

    async def _hello(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=200)

    def _usage(self, output: int) -> tuple[dict[str, int], int]:
        """What an answer's start reports (input and cache counts, one output token so far),
        and its final output count; the total goes to `reported`."""
        given = self.usage or {"input_tokens": 12, "output_tokens": output}
        start = {k: v for k, v in given.items() if k != "output_tokens"}
        final = given.get("output_tokens", output)
        with self._lock:
            self.reported.append({**start, "output_tokens": final})
        return {**start, "output_tokens": 1}, final

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request) or {}
        model = body.get("model", "claude-stub")
        message = {
            "id": f"msg_stub{len(self._requests):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
        }
        if not body.get("stream"):
            start, final = self._usage(1)
            message["content"] = [{"type": "text", "text": self.reply}]
            message["stop_reason"] = "end_turn"
            message["usage"] = {**start, "output_tokens": final}
            return web.json_response(message)
        bash = self._wants_bash(body)
        start, final = self._usage(20 if bash else 9)
        message["usage"] = start
        if bash:
            return await self._stream(request, self._bash_events(message, final))
        text_block = {"type": "text", "text": ""}
        events: list[tuple[str, dict[str, Any]]] = [
            ("message_start", {"message": message}),
            ("content_block_start", {"index": 0, "content_block": text_block}),
            ("ping", {}),
            (
                "content_block_delta",
                {"index": 0, "delta": {"type": "text_delta", "text": self.reply}},
            ),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": final},
                },
            ),
            ("message_stop", {}),
        ]
        return await self._stream(request, events)

    def _wants_bash(self, body: dict[str, Any]) -> bool:
        """A turn of the main loop (it offers Bash) with fewer than `bash_calls` tool results
        since the user's own text: one to answer with a tool call."""
        if self.bash_command is None:
            return False
        if not any(
            isinstance(t, dict) and t.get("name") == "Bash" for t in body.get("tools") or []
        ):
            return False
        results = 0
        for message in reversed(body.get("messages") or []):
            if not isinstance(message, dict) or message.get("role") != "user":
                continue
            content = message.get("content")
            blocks = content if isinstance(content, list) else []
            if not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
                break  # the user's own text: the turn began there
            results += 1
        return results < self.bash_calls

    def _bash_events(
        self, message: dict[str, Any], output_tokens: int
    ) -> list[tuple[str, dict[str, Any]]]:
        self._tool_uses += 1
        tool = {"type": "tool_use", "id": f"toolu_stub{self._tool_uses:04d}", "name": "Bash"}
        args = json.dumps({"command": self.bash_command, "description": "Run the stub's command"})
        return [
            ("message_start", {"message": message}),
            ("content_block_start", {"index": 0, "content_block": {**tool, "input": {}}}),
            (
                "content_block_delta",
                {
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                },
            ),
            ("content_block_stop", {"index": 0}),
            (
                "message_delta",
                {
                    "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                },
            ),
            ("message_stop", {}),
        ]

    async def _stream(
        self, request: web.Request, events: list[tuple[str, dict[str, Any]]]
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for name, data in events:
            await resp.write(_sse(name, {"type": name, **data}))
        await resp.write_eof()
        return resp

    async def _other(self, request: web.Request) -> web.Response:
        # Telemetry, feature flags, token counting...: recorded and refused, which the CLI
        # tolerates offline.
        await self._record(request)
        return web.json_response({"error": {"type": "not_found", "message": "stub"}}, status=404)

    # --- lifecycle ---------------------------------------------------------------------------
    def start(self) -> AnthropicStub:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("HEAD", "/api/hello", self._hello)
        app.router.add_route("GET", "/api/hello", self._hello)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self.url = self._server.serve(app)
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> AnthropicStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


TEST_API_KEY = "sk-ant-api03-TESTKEY-abcdefghij0123456789"


def claude_json(workspace: str, api_key: str = TEST_API_KEY) -> dict[str, Any]:
    """`~/.claude.json` that takes the real CLI past onboarding, key approval and trust prompts."""
    return {
        "hasCompletedOnboarding": True,
        "hasSeenAutoDefaultNudge": True,  # 2.1.330 asks once whether auto mode should be default
        "theme": "dark",
        "customApiKeyResponses": {"approved": [api_key[-20:]], "rejected": []},
        "projects": {workspace: {"hasTrustDialogAccepted": True}},
    }
