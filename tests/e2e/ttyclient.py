"""A minimal ttyd WebSocket client, speaking the protocol ttyd's own web page speaks.

Client -> server: first a JSON hello `{"AuthToken", "columns", "rows"}`, then `0<input>` to type.
Server -> client: `0<output>` terminal bytes, `1<title>`, `2<preferences json>`. The screen text
is the output with escape sequences stripped - enough to find words the CLI drew.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re

import aiohttp

from tests.harness import wait_for_async

_ESCAPES = re.compile(
    rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_()][0-9A-Za-z]?"
)

_CURSOR_FORWARD = re.compile(rb"\x1b\[(\d*)C")


class TerminalClient:
    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._session = session
        self._ws = ws
        self.raw = bytearray()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, columns: int = 200, rows: int = 50) -> TerminalClient:
        session = aiohttp.ClientSession()
        try:
            ws = await session.ws_connect(
                url, protocols=("tty",), timeout=aiohttp.ClientWSTimeout(ws_close=5)
            )
            hello = {"AuthToken": "", "columns": columns, "rows": rows}
            await ws.send_bytes(json.dumps(hello).encode())
        except BaseException:
            await session.close()
            raise
        return cls(session, ws)

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
                if data[:1] == b"0":
                    self.raw += data[1:]

    @staticmethod
    def screen_text(raw: bytes) -> str:
        """Terminal output as text: cursor-forward moves become spaces, other escapes go."""
        spaced = _CURSOR_FORWARD.sub(lambda m: b" " * int(m.group(1) or b"1"), raw)
        return _ESCAPES.sub(b"", spaced).decode(errors="replace")

    @property
    def text(self) -> str:
        """Everything drawn so far."""
        return self.screen_text(bytes(self.raw))

    async def wait_for(self, needle: str, timeout: float, *, since: int = 0) -> str:
        """Poll the received output (from byte `since`) for `needle`, with a deadline.

        Whitespace is ignored: a TUI may draw a gap by moving the cursor or by redrawing.
        """
        want = "".join(needle.split())
        seen = ""

        def drawn() -> str | None:
            nonlocal seen
            seen = self.screen_text(bytes(self.raw[since:]))
            return seen if want in "".join(seen.split()) else None

        return await wait_for_async(
            drawn, timeout, interval=0.1, what=lambda: f"{needle!r}; last output:\n{seen[-1500:]}"
        )

    async def type(self, text: str) -> None:
        await self._ws.send_bytes(b"0" + text.encode())

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._session.close()
