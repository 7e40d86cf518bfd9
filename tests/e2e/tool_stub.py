"""A small stand-in for the OpenAI (Responses, Chat Completions) and Gemini APIs on 127.0.0.1, so
Codex CLI, opencode and Gemini CLI reach a permission prompt offline: a turn whose last message
is the user's text is answered with a call of the request's own shell tool running `command`,
any other turn with a line of text. It captured tests/screens; no real API is reachable here.
Where each request carried a key (its key headers and `?key=`) is GET /stub/keys.

    python -m tests.e2e.tool_stub PORT COMMAND
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from aiohttp import web

REPLY_TEXT = "Hello from the tool-call stub."
COMMAND = web.AppKey("command", str)
# The usage every Gemini turn reports (its prompt count includes the cached tokens); how many
# turns of each API the stub answered is GET /stub/answered: the tests' known numbers.
GEMINI_USAGE = {
    "promptTokenCount": 1234,
    "cachedContentTokenCount": 56,
    "candidatesTokenCount": 200,
    "thoughtsTokenCount": 30,
    "toolUsePromptTokenCount": 7,
    "totalTokenCount": 1471,
}
# The usage every Responses turn reports (Codex): its input includes the cached tokens, its
# output the reasoning ones.
RESPONSES_USAGE: dict[str, Any] = {
    "input_tokens": 1234,
    "input_tokens_details": {"cached_tokens": 56},
    "output_tokens": 200,
    "output_tokens_details": {"reasoning_tokens": 30},
    "total_tokens": 1434,
}
ANSWERED = web.AppKey("answered", dict[str, int])
KEYS = web.AppKey("keys", list[dict[str, str]])
# Where the CLIs send an API key: OpenAI's Bearer, Anthropic's, Google's header and query.
KEY_HEADERS = ("authorization", "x-api-key", "x-goog-api-key")
ASKED = "Run the stub's command"


def _escalated(command: str) -> dict[str, Any]:
    # Codex asks a person for a command the model wants run outside its sandbox.
    return {"cmd": command, "sandbox_permissions": "require_escalated", "justification": ASKED}


# Each CLI's shell tool by name, and its arguments for one command.
SHELL_TOOLS: dict[str, Callable[[str], dict[str, Any]]] = {
    "exec_command": _escalated,  # Codex CLI
    "shell": lambda c: {"command": ["bash", "-lc", c]},  # older Codex CLI
    "bash": lambda c: {"command": c, "description": ASKED},  # opencode
    "run_shell_command": lambda c: {"command": c, "description": ASKED},  # Gemini CLI
}


def _call(request: web.Request, names: Iterable[str], from_user: bool) -> tuple[str, str] | None:
    """(tool, JSON arguments) when this turn is to be answered with a shell call."""
    tool = next((n for n in names if n in SHELL_TOOLS), None)
    if tool is None or not from_user:
        return None
    return tool, json.dumps(SHELL_TOOLS[tool](request.app[COMMAND]))


async def _send(
    request: web.Request, events: Iterable[tuple[str | None, Any]]
) -> web.StreamResponse:
    """Server-sent events: (event name or None, data as JSON or a plain string)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        body = data if isinstance(data, str) else json.dumps(data)
        await resp.write(f"{head}data: {body}\n\n".encode())
    await resp.write_eof()
    return resp


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI Responses API (Codex CLI's custom model provider)."""
    body = await request.json()
    items = body.get("input") or [{}]
    names = [t.get("name", "") for t in body.get("tools") or []]
    call = _call(request, names, items[-1].get("role") == "user")
    item: dict[str, Any] = {"id": "item_stub", "status": "completed"}
    if call:
        item |= {"type": "function_call", "call_id": "call_stub", "name": call[0]}
        item["arguments"] = call[1]
    else:
        text = {"type": "output_text", "text": REPLY_TEXT, "annotations": []}
        item |= {"type": "message", "role": "assistant", "content": [text]}
    done = {"id": "resp_stub", "status": "completed", "usage": RESPONSES_USAGE}
    request.app[ANSWERED]["responses"] += 1
    return await _send(
        request,
        [
            ("response.created", {"type": "response.created", "response": {"id": "resp_stub"}}),
            ("response.output_item.done", {"type": "response.output_item.done", "item": item}),
            ("response.completed", {"type": "response.completed", "response": done}),
        ],
    )


async def chat(request: web.Request) -> web.StreamResponse:
    """OpenAI Chat Completions (opencode's OpenAI-compatible provider)."""
    body = await request.json()
    messages = body.get("messages") or [{}]
    names = [t.get("function", {}).get("name", "") for t in body.get("tools") or []]
    call = _call(request, names, messages[-1].get("role") == "user")
    delta: dict[str, Any] = {"role": "assistant", "content": REPLY_TEXT}
    if call:
        function = {"name": call[0], "arguments": call[1]}
        tool_call = {"index": 0, "id": "call_stub", "type": "function", "function": function}
        delta = {"role": "assistant", "tool_calls": [tool_call]}
    chunk = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "model": "stub"}
    last = {"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}
    return await _send(
        request,
        [
            (None, chunk | {"choices": [{"index": 0, "delta": delta}]}),
            (
                None,
                chunk | {"choices": [last], "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
            ),
            (None, "[DONE]"),
        ],
    )


async def gemini(request: web.Request) -> web.StreamResponse:
    """Gemini API `models/{model}:{method}` (Gemini CLI with GOOGLE_GEMINI_BASE_URL)."""
    body = await request.json()
    method = request.match_info["method"]
    if method == "countTokens":
        return web.json_response({"totalTokens": 1})
    if method == "generateContent":
        # Gemini CLI's own side requests (its model router asks for this JSON), not turns.
        text = json.dumps({"reasoning": "stub", "model_choice": "flash"})
        content = {"role": "model", "parts": [{"text": text}]}
        return web.json_response({"candidates": [{"content": content, "finishReason": "STOP"}]})
    contents = body.get("contents") or [{}]
    from_user = contents[-1].get("role") == "user" and all(
        "text" in part for part in contents[-1].get("parts") or []
    )
    declared = [f for t in body.get("tools") or [] for f in t.get("functionDeclarations") or []]
    call = _call(request, [f.get("name", "") for f in declared], from_user)
    part: dict[str, Any] = {"text": REPLY_TEXT}
    if call:
        part = {"functionCall": {"name": call[0], "args": json.loads(call[1])}}
    content = {"role": "model", "parts": [part]}
    answer = {
        "candidates": [{"content": content, "finishReason": "STOP"}],
        "usageMetadata": GEMINI_USAGE,
    }
    request.app[ANSWERED]["gemini"] += 1
    return await _send(request, [(None, answer)])


async def answered(request: web.Request) -> web.Response:
    return web.json_response(request.app[ANSWERED])


@web.middleware
async def keys_seen(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Records each API request's path and the key it carried, wherever it was."""
    if not request.path.startswith("/stub/"):
        found = {h: request.headers[h] for h in KEY_HEADERS if h in request.headers}
        if "key" in request.query:
            found["?key"] = request.query["key"]
        request.app[KEYS].append({"path": request.path, **found})
    return await handler(request)


async def keys(request: web.Request) -> web.Response:
    return web.json_response(request.app[KEYS])


async def other(request: web.Request) -> web.Response:
    # Model lists, telemetry, feature flags...: refused, which the CLIs tolerate offline.
    return web.json_response({"error": {"message": "stub"}}, status=404)


def make_app(command: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[keys_seen])
    app[COMMAND] = command
    app[KEYS] = []
    app[ANSWERED] = {"gemini": 0, "responses": 0}
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1beta/models/{model}:{method}", gemini)
    app.router.add_get("/stub/answered", answered)
    app.router.add_get("/stub/keys", keys)
    app.router.add_route("*", "/{tail:.*}", other)
    return app


# ---- how each CLI is pointed at the stub --------------------------------------------------------


def codex_config(base_url: str, workspace: str, env_key: str, extra: str = "") -> str:
    """Codex's config.toml: the stub at `base_url` (…/v1) as its model provider, the key in
    `env_key`, the workspace trusted; `extra` goes in the top-level table."""
    return f"""model = "stub-model"
model_provider = "stub"
{extra}
[model_providers.stub]
name = "stub"
base_url = "{base_url}"
env_key = "{env_key}"
wire_api = "responses"

[projects."{workspace}"]
trust_level = "trusted"
"""


def opencode_config(port: int) -> dict[str, Any]:
    """opencode's opencode.json: an OpenAI-compatible provider at the stub, asking before bash
    and edits."""
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Stub",
        "options": {"baseURL": f"http://127.0.0.1:{port}/v1", "apiKey": "sk-stub"},
        "models": {"stub-model": {"name": "Stub Model"}},
    }
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"stub": provider},
        "model": "stub/stub-model",
        "permission": {"bash": "ask", "edit": "ask"},
    }


@contextlib.contextmanager
def running(command: str) -> Iterator[int]:
    """The stub in a process of its own on a free loopback port (the port), answering a prompt
    with a call of `command`; stopped on leaving."""
    from sidecar.core.loopback import free_port
    from tests.harness import REPO, http, wait_for

    port = free_port()
    argv = [sys.executable, "-m", "tests.e2e.tool_stub", str(port), command]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/ready"
        wait_for(lambda: http("GET", url)[0] == 404, 15, what="the tool-call stub")
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    web.run_app(make_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), access_log=None)
