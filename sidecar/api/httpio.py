"""JSON in and out of the API's handlers: a request body decoded into its typed shape, a typed
answer encoded. Size limits are aiohttp's (`client_max_size`); statuses are `sidecar.api.app`'s."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, TypeVar

import msgspec
import msgspec.inspect
from aiohttp import web

from sidecar.core.masks import scrub
from sidecar.core.shapes import Answer, Error, Request

R = TypeVar("R", bound=Request)
JSON = "application/json"

_encode = msgspec.json.Encoder().encode


class BadRequest(Exception):
    """The request cannot be served as sent; `sidecar.api.app` answers it with a 400."""


async def read_body(request: web.Request, shape: type[R]) -> R:
    """The request body as `shape`. Unknown fields, wrong types, nulls and malformed JSON raise
    BadRequest naming the field; a body over the limit is aiohttp's 413."""
    raw = await request.read()
    return decode(raw, shape)


async def read_optional_body(request: web.Request, shape: type[R]) -> R | None:
    """As `read_body`, but an absent or blank body is None."""
    raw = await request.read()
    return decode(raw, shape) if raw.strip() else None


async def read_bounded(request: web.Request, limit: int) -> bytes | None:
    """The body, read past the API's own limit up to `limit` (None: bigger than that)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _integral(value: Any) -> Any:
    """Integral numbers as ints: JSON Schema's `integer` (what the document says) takes 30.0
    as well as 30, msgspec's `int` only the latter (and a float field takes an int)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(item) for item in value]
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    return value


def decode(raw: bytes, shape: type[R]) -> R:
    try:
        return msgspec.convert(_integral(msgspec.json.decode(raw)), type=shape)
    except RecursionError:
        msg = "invalid body: nested too deeply"
        raise BadRequest(msg) from None
    except msgspec.ValidationError as exc:
        msg = f"invalid body: {exc}{_allowed(shape, str(exc))}"
        raise BadRequest(msg) from None
    except msgspec.DecodeError as exc:
        msg = f"body is not valid JSON: {exc}"
        with contextlib.suppress(ValueError, RecursionError):
            # msgspec refuses an escaped lone surrogate ("\\ud800"), at the end of a string
            # with a misleading "truncated": say what it is when the stdlib parser accepts it.
            json.loads(raw)
            msg = "body is not valid JSON text: a string holds a lone UTF-16 surrogate escape"
        raise BadRequest(msg) from None


def _allowed(shape: type[Request], problem: str) -> str:
    """For a value outside a top-level field's fixed set, the set (msgspec names only the
    field)."""
    field = re.fullmatch(r"Invalid enum value .* - at `\$\.(\w+)`", problem)
    if field is None:
        return ""
    info = msgspec.inspect.type_info(shape)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        if f.encode_name == field.group(1) and isinstance(f.type, msgspec.inspect.LiteralType):
            return f"; one of: {', '.join(map(str, f.type.values))}"
    return ""


def encode(value: Any) -> bytes:
    return scrub(_encode(value))


def answer(value: Answer, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(value), status=status, content_type=JSON, headers=headers)


def raw_answer(body: bytes, status: int = 200) -> web.Response:
    """An answer encoded earlier (and shared between requests)."""
    return web.Response(body=scrub(body), status=status, content_type=JSON)


def error(status: int, message: str, **headers: str) -> web.Response:
    return answer(Error(error=message), status, headers or None)
