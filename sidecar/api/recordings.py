"""`GET /recordings` (the CLI runs recorded), `GET /recordings/{id}` (one, as the asciicast v2 file
it is) and `GET /player/{file}` (the asciinema web player the dashboard replays them with: the
pinned npm package's two files, installed beside the sidecar by scripts/setup or the image's
build, served from here so that the page loads nothing from another origin).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from aiohttp import web

from sidecar.agent.recorder import Recorder
from sidecar.api import httpio
from sidecar.api.openapi import Media, Operation
from sidecar.core.contract import rfc3339
from sidecar.core.shapes import RecordingItem, RecordingsAnswer
from sidecar.record.store import NoRecording

ASCIICAST = "application/x-asciicast"
CHUNK = 1024 * 1024
# Where scripts/setup and the image put the player (`image/fetch-player.sh`): under the prefix
# of the Python that runs the sidecar (the venv's, /opt/sidecar in the image).
PLAYER_DIR = Path(sys.prefix) / "share" / "sleeve-sidecar" / "asciinema-player"
PLAYER_FILES = {
    "asciinema-player.min.js": "text/javascript",
    "asciinema-player.css": "text/css",
}


class PlayerMissing(LookupError):
    """The player's files are not installed here (404)."""


def complete_size(fd: int) -> int:
    """The file's size up to its last whole line (a recording being written may end with part
    of a line the writer has not finished)."""
    end = os.fstat(fd).st_size
    while end > 0:  # back from the end, a block at a time: a line may be longer than a block
        start = max(0, end - CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


async def _send_file(request: web.Request, path: Path, name: str) -> web.StreamResponse:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise NoRecording(name) from None
    try:
        size = await asyncio.to_thread(complete_size, fd)
        response = web.StreamResponse(
            headers={
                "Content-Type": ASCIICAST,
                "Content-Disposition": f'inline; filename="{name}.cast"',
                "Cache-Control": "no-store",
                "X-Content-Type-Options": "nosniff",
            }
        )
        response.content_length = size
        await response.prepare(request)
        offset = 0
        while offset < size:
            block = await asyncio.to_thread(os.pread, fd, min(CHUNK, size - offset), offset)
            if not block:
                break
            await response.write(block)
            offset += len(block)
        await response.write_eof()
        return response
    finally:
        os.close(fd)


def recording_operations(recorder: Recorder) -> list[Operation]:
    async def listing(request: web.Request) -> web.Response:
        items = await recorder.items()
        return httpio.answer(
            RecordingsAnswer(
                recordings=[
                    RecordingItem(
                        id=item.id,
                        cli=item.cli,
                        started=rfc3339(item.started),
                        ended=rfc3339(item.ended) if item.ended is not None else None,
                        bytes=item.bytes,
                        markers=item.markers,
                    )
                    for item in items
                ]
            )
        )

    async def one(request: web.Request) -> web.StreamResponse:
        rec_id = request.match_info["id"]
        return await _send_file(request, recorder.store.path(rec_id), rec_id)

    async def player(request: web.Request) -> web.FileResponse:
        name = request.match_info["file"]
        path = PLAYER_DIR / name
        if name not in PLAYER_FILES or not path.is_file():
            msg = f"the asciinema player is not installed here ({PLAYER_DIR}; scripts/setup)"
            raise PlayerMissing(msg)
        return web.FileResponse(
            path,
            headers={
                "Content-Type": PLAYER_FILES[name],
                "Cache-Control": "max-age=3600",
                "X-Content-Type-Options": "nosniff",
            },
        )

    return [
        Operation(
            "GET",
            "/recordings",
            listing,
            "getRecordings",
            "status",
            "The CLI runs recorded (asciicast v2), oldest first",
            {200: RecordingsAnswer},
            description="One recording per CLI run (a resleeve, a restart or a heal starts a "
            "new one), in `SIDECAR_RECORD_DIR`, the oldest removed past "
            "`SIDECAR_RECORD_MAX_MB`. The view token is enough.",
        ),
        Operation(
            "GET",
            "/recordings/{id}",
            one,
            "getRecording",
            "status",
            "One recording, as its asciicast v2 file",
            {
                200: Media(
                    "the recording (asciinema play/cat and the web player read it)", ASCIICAST
                )
            },
            description='Markers (`"m"` events) for the agent\'s states, approvals asked '
            "and answered, egress refusals, resleeves, heals and inbox notices; secrets and "
            "the API's tokens redacted. A recording still being written is served up to its "
            "last whole event. 404: no such recording. The view token is enough.",
            errors=(404,),
            parameters=(
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
            ),
        ),
        Operation(
            "GET",
            "/player/{file}",
            player,
            "getPlayer",
            "meta",
            "The asciinema web player the dashboard replays recordings with",
            {
                200: tuple(
                    Media(f"the player's `{name}`", kind) for name, kind in PLAYER_FILES.items()
                )
            },
            description="The pinned npm package `asciinema-player`, installed beside the "
            "sidecar and checked by hash (scripts/setup, the image). 404: not installed.",
            errors=(404,),
            parameters=(
                {
                    "name": "file",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": sorted(PLAYER_FILES)},
                },
            ),
        ),
    ]
