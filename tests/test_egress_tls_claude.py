"""The real Claude Code (a Bun binary) through the egress proxy's TLS termination: its API is
`https://localhost:PORT` (the Anthropic stub served over TLS with a test CA's certificate, given
to the proxy as SIDECAR_EGRESS_CA_FILE), its key a placeholder, the sleeve's CA trusted through
`trust_env`. At the proxy level: the sidecar's wiring of secrets is another branch's."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.agenttools import claude_binary
from tests.e2e.anthropic_stub import REPLY_TEXT, AnthropicStub, claude_json
from tests.tls_pki import PLACEHOLDER, REAL, Pki, make_pki, rig, run
from tests.tools import require_executable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


class HttpsAnthropicStub(AnthropicStub):
    """The Anthropic stub over TLS, also keeping the key each request carried."""

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__(ssl_context=context)
        self.keys: list[str | None] = []

    async def _record(self, request: web.Request) -> Any:
        self.keys.append(request.headers.get("x-api-key"))
        return await super()._record(request)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    require_executable("openssl", "Debian's openssl package (ca-certificates depends on it)")
    return make_pki(tmp_path_factory.mktemp("pki"))


async def test_claude_code_with_a_placeholder_key_reaches_the_api_with_the_real_one(
    pki: Pki, tmp_path: Path
) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*pki.certs["good"])
    stub = HttpsAnthropicStub(context).start()
    try:
        port = int(stub.url.rsplit(":", 1)[1])
        home = tmp_path / "home"
        (home / ".claude").mkdir(parents=True)
        config = claude_json(str(tmp_path), api_key=PLACEHOLDER.decode())
        (home / ".claude.json").write_text(json.dumps(config))
        async with rig(pki, tmp_path, [port]) as r:
            env = r.env | {
                "HOME": str(home),
                "ANTHROPIC_BASE_URL": f"https://localhost:{port}",
                "ANTHROPIC_API_KEY": PLACEHOLDER.decode(),
                "DISABLE_AUTOUPDATER": "1",
                "NODE_USE_ENV_PROXY": "1",
                "PATH": f"{claude_binary().parent}:{os.environ['PATH']}",
            }
            status, out = await run([str(claude_binary()), "-p", "say hello"], env, tmp_path)
    finally:
        stub.stop()
    assert (status, out.strip()) == (0, REPLY_TEXT), out
    assert stub.messages_posts()
    assert stub.keys and set(stub.keys) == {REAL.decode()}  # on every request, never the other
