"""Talking to an egress proxy in the tests: one request's whole answer."""

from __future__ import annotations

import asyncio

from sidecar.egress.proxy import EgressProxy


async def exchange(proxy: EgressProxy, data: bytes) -> bytes:
    """The whole response to `data` (the proxy closes after an answer it refuses)."""
    reader, writer = await asyncio.open_connection(*proxy.address)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(-1), 10)
    finally:
        writer.close()
