"""Just enough PNG decoding (8-bit RGB/RGBA, not interlaced - what Chromium writes) to count
pixels of a colour in a screenshot, without adding an imaging library to the dev extras."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path


def read_png(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes)."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        msg = f"{path} is not a PNG"
        raise ValueError(msg)
    pos, idat = 8, b""
    width = height = color = depth = interlace = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    if depth != 8 or color not in (2, 6) or interlace:
        msg = f"unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})"
        raise ValueError(msg)
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            ul = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + ((left + up) >> 1)) & 0xFF
            elif kind == 4:
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else ul)
                line[i] = (line[i] + pred) & 0xFF
        prev = line
        rgb = line if bpp == 3 else bytearray(b for i, b in enumerate(line) if i % 4 != 3)
        rows.append(bytes(rgb))
    return width, height, rows


def count_near(rows: list[bytes], rgb: tuple[int, int, int], tolerance: int = 40) -> int:
    """Pixels within `tolerance` (per channel) of `rgb`."""
    r0, g0, b0 = rgb
    found = 0
    for row in rows:
        for i in range(0, len(row), 3):
            if (
                abs(row[i] - r0) <= tolerance
                and abs(row[i + 1] - g0) <= tolerance
                and abs(row[i + 2] - b0) <= tolerance
            ):
                found += 1
    return found
