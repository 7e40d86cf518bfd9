"""Headless Chromium driven over the DevTools protocol: open a page, wait for a condition in it,
take a screenshot (kept where `fresh_artifact` says). Chromium's one-shot `--screenshot` fires
on the load event, before a WebSocket terminal has drawn anything, so a test that must see the
terminal waits in the page.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.harness import REPO, wait_for_async

# ttyd's page keeps its xterm.js Terminal in `window.term`: its buffer is the screen as text.
TERMINAL_TEXT_JS = """
(() => {
  const frame = document.getElementById('terminal');
  const win = frame ? frame.contentWindow : window;
  const term = win && win.term;
  if (!term) return '';
  const buf = term.buffer.active;
  const lines = [];
  for (let i = 0; i < buf.length; i++) {
    const line = buf.getLine(i);
    if (line) lines.push(line.translateToString(true));
  }
  return lines.join('\\n');
})()
"""

# Two animation frames: whatever the buffer holds has been painted.
PAINTED_JS = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(1))))"


def fresh_artifact(name: str) -> Path:
    """Where a screenshot is kept (SIDECAR_ARTIFACTS, else artifacts/), any old one removed."""
    artifacts = Path(os.environ.get("SIDECAR_ARTIFACTS", REPO / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    shot = artifacts / name
    shot.unlink(missing_ok=True)
    return shot


class Browser:
    def __init__(self, proc: subprocess.Popen[bytes], session: aiohttp.ClientSession,
                 ws: aiohttp.ClientWebSocketResponse) -> None:  # fmt: skip
        self._proc = proc
        self._session = session
        self._ws = ws
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []  # what the browser told meanwhile (if enabled)

    @classmethod
    async def start(cls, chromium: str, profile: Path, size: tuple[int, int]) -> Browser:
        # ttyd's xterm.js draws with WebGL; without a GPU Chromium needs SwiftShader allowed.
        argv = [
            chromium, "--headless", "--no-sandbox", "--enable-unsafe-swiftshader",
            "--use-angle=swiftshader", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--window-size={size[0]},{size[1]}", f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        session = aiohttp.ClientSession()
        try:
            port_file = profile / "DevToolsActivePort"

            def port_written() -> str:
                if proc.poll() is not None:
                    msg = f"chromium did not open its DevTools port (exit {proc.poll()})"
                    raise RuntimeError(msg)
                return port_file.read_text().strip()  # absent: FileNotFoundError, "not yet"

            await wait_for_async(port_written, 30, interval=0.05, what="chromium's DevTools port")
            port = int(port_file.read_text().split()[0])
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            page = next(t for t in targets if t["type"] == "page")
            ws = await session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        except BaseException:
            await session.close()
            proc.kill()
            proc.wait()
            raise
        return cls(proc, session, ws)

    async def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """`session`: a target attached with `flatten` (a service worker), else the page."""
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        await self._ws.send_str(json.dumps(message))
        async for msg in self._ws:
            data = json.loads(msg.data)
            if "method" in data:
                self.events.append(data)
            elif data.get("id") == msg_id:
                if "error" in data:
                    raise RuntimeError(f"{method}: {data['error']}")
                return dict(data.get("result", {}))
        msg = "DevTools connection closed"
        raise RuntimeError(msg)

    async def evaluate(self, expression: str, session: str | None = None) -> Any:
        result = await self.call(
            "Runtime.evaluate",
            session,
            expression=expression,
            returnByValue=True,
            awaitPromise=True,
        )
        return result.get("result", {}).get("value")

    async def open(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)

    async def wait_for_text(self, expression: str, needles: list[str], timeout: float) -> str:
        """Poll `expression` (a string) until it contains every needle, with a deadline."""
        text = ""

        async def shown() -> str | None:
            nonlocal text
            text = str(await self.evaluate(expression) or "")
            return text if all(n in text for n in needles) else None

        return await wait_for_async(
            shown,
            timeout,
            interval=0.2,
            what=lambda: f"{needles} in the page; it shows:\n{text[-1500:]}",
        )

    async def screenshot(self, path: Path) -> None:
        await self.evaluate(PAINTED_JS)
        shot = await self.call("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(shot["data"]))

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # the browser may already be gone
            await self._ws.close()
        await self._session.close()
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
