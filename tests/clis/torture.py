"""Writes adversarial terminal output as fast as the pane takes it, for the pane-output torture
test: `torture.py SEED [LIMIT_BYTES]`. Every escape-sequence family a terminal parser meets (CSI
with huge, many, empty and colon parameters, private modes, the alternate screen, scroll and
margin regions, OSC titles, hyperlinks (8), clipboard (52) and colour queries, DCS with sixel
images, DECRQSS and passthrough, APC/PM/SOS strings, unterminated strings, 7- and 8-bit C1
controls, charsets, resets), invalid UTF-8, wide, combining, zero-width and bidi characters.

The byte stream is a function of SEED alone (chunk n from `random.Random(f"{SEED}:{n}")`), so a
failure replays with the same seed: `python3 tests/clis/torture.py SEED > /dev/null` makes it
again, and `chunk(SEED, n)` gives any one chunk. What the terminal answers (device reports,
colour queries) is read from stdin and dropped, so tmux never has to buffer it.
"""

from __future__ import annotations

import base64
import random
import sys
import threading
from collections.abc import Callable

ESC = "\x1b"
CSI = ESC + "["
OSC = ESC + "]"
DCS = ESC + "P"
ST = ESC + "\\"
BEL = "\x07"
CHUNK = 1 << 16  # bytes per write, about

WIDE = "漢字かなカナ한글😀🎉👍🇺🇸🏳️‍🌈👨‍👩‍👧‍👦❤️"
COMBINING = "\u0300\u0301\u0302\u0303\u0308\u030a\u0327\u0336\u20dd\u093f\u0e31"
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u202e\u202d\u2066\u2069\u00ad"
INVALID_UTF8 = (
    b"\x80",
    b"\xbf\xbf",
    b"\xc0\xaf",  # overlong '/'
    b"\xe0\x80\xaf",
    b"\xed\xa0\x80",  # a surrogate
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"\xf8\x88\x80\x80\x80",  # five bytes
    b"\xfc\x84\x80\x80\x80\x80",
    b"\xfe\xff",
    b"\xe2\x82",  # truncated
    b"\xf0\x9f\x98",
    b"\xc2",
)


def _num(rng: random.Random) -> str:
    return rng.choice(
        [
            "",
            "0",
            "1",
            str(rng.randrange(300)),
            str(rng.randrange(1 << 16)),
            str(2**31 - 1),
            str(2**31),
            str(2**32 + 1),
            "9" * rng.randrange(20, 400),
            "-1",
        ]
    )


def _params(rng: random.Random) -> str:
    count = rng.choice([0, 1, 2, 3, 5, rng.randrange(16, 40), rng.randrange(200, 2000)])
    sep = rng.choice([";", ";", ":"])
    return sep.join(_num(rng) for _ in range(count))


def csi(rng: random.Random) -> str:
    final = rng.choice("@ABCDEFGHIJKLMPSTXZ`abcdefghilmnpqrstuxz")
    prefix = rng.choice(["", "", "?", ">", "<", "=", "!"])
    inter = rng.choice(["", "", "", " ", "$", '"', "'", "*"])
    return CSI + prefix + _params(rng) + inter + final


def modes(rng: random.Random) -> str:
    """Private and ANSI modes on and off: alternate screen, origin, wrap, mouse, paste, sync."""
    mode = rng.choice(
        [1049, 1047, 47, 1048, 6, 7, 25, 69, 1000, 1002, 1003, 1004, 1005, 1006, 1015, 2004, 2026]
    )
    return CSI + "?" + str(mode) + rng.choice("hl") + (CSI + "4" + rng.choice("hl"))


def regions(rng: random.Random) -> str:
    """Scroll and margin regions, then scrolling, inserting and deleting through them."""
    top, bottom = rng.randrange(0, 60), rng.randrange(0, 60)
    left, right = rng.randrange(0, 220), rng.randrange(0, 220)
    moves = "".join(
        CSI + _num(rng) + rng.choice("LMST@PX") + rng.choice(["\n", ESC + "M", ESC + "D", ""])
        for _ in range(rng.randrange(1, 20))
    )
    return (
        f"{CSI}{top};{bottom}r{CSI}?69h{CSI}{left};{right}s{CSI}?6h{moves}{CSI}r{CSI}?69l{CSI}?6l"
    )


def window_ops(rng: random.Random) -> str:
    """Resize requests and reports (CSI t), device status and attribute queries."""
    ops = [
        f"{CSI}8;{_num(rng)};{_num(rng)}t",
        f"{CSI}4;{_num(rng)};{_num(rng)}t",
        f"{CSI}{rng.choice(['14', '18', '19', '21', '22;0', '23;0'])}t",
        f"{CSI}6n",
        f"{CSI}?6n",
        f"{CSI}c",
        f"{CSI}>c",
        f"{CSI}>0q",
        f"{CSI}?u",
        f"{CSI}>{_num(rng)};{_num(rng)}m",
        f"{CSI}={_num(rng)};{_num(rng)}u",
    ]
    return "".join(rng.choice(ops) for _ in range(rng.randrange(1, 6)))


def osc(rng: random.Random) -> str:
    end = rng.choice([BEL, ST, ST, ""])  # "" : left open, closed by whatever comes next
    big = "x" * rng.choice([0, 10, 4000, 70000])
    payload = base64.b64encode(rng.randbytes(rng.choice([0, 16, 3000, 60000]))).decode()
    forms = [
        f"{OSC}0;title {rng.random()}{big}{end}",
        f"{OSC}2;{'é漢😀' * rng.randrange(1, 500)}{end}",
        f"{OSC}8;id={rng.randrange(1 << 30)};https://example.invalid/{big}{end}link{OSC}8;;{end}",
        f"{OSC}8;;{end}",
        f"{OSC}52;c;{payload}{end}",
        f"{OSC}52;{rng.choice(['c', 'p', 's', '', 'cpqs01234567'])};?{end}",
        f"{OSC}4;{_num(rng)};rgb:{rng.randrange(256):02x}/00/ff{end}",
        f"{OSC}4;{_num(rng)};?{end}",
        f"{OSC}{rng.choice(['10', '11', '12', '17', '19'])};?{end}",
        f"{OSC}104;{_params(rng)}{end}",
        f"{OSC}7;file://host/{big}{end}",
        f"{OSC}133;{rng.choice('ABCD')}{end}",
        f"{OSC}1337;File=inline=1:{payload}{end}",
        f"{OSC}{_num(rng)};{big}{end}",
        f"{OSC}{end}",
    ]
    return rng.choice(forms)


def sixel(rng: random.Random) -> str:
    """A sixel image: colour registers, raster attributes (sometimes absurd), repeats, bands."""
    width, height = rng.choice([(1, 1), (64, 36), (rng.randrange(1, 2000), rng.randrange(1, 2000))])
    body = [f'"1;1;{width};{height}']
    for reg in range(rng.randrange(1, 20)):
        body.append(f"#{reg};2;{rng.randrange(101)};{rng.randrange(101)};{rng.randrange(101)}")
    for _ in range(rng.randrange(1, 30)):
        body.append(f"#{rng.randrange(300)}")
        for _ in range(rng.randrange(1, 200)):
            pixels = chr(rng.randrange(0x3F, 0x7F))
            body.append(rng.choice([pixels, f"!{_num(rng)}{pixels}"]))  # `!N`: repeat N times
        body.append(rng.choice(["$", "-", "$-", ""]))
    head = f"{DCS}{rng.choice(['', '0', '7', '9'])};{rng.choice(['', '0', '1', '2'])};{_num(rng)}q"
    return head + "".join(body) + rng.choice([ST, ST, ""])


def dcs(rng: random.Random) -> str:
    forms = [
        sixel(rng),
        DCS + "$q" + rng.choice(["m", "r", "s", " q", '"p', "t"]) + ST,
        f"{DCS}tmux;{ESC}{ESC}]0;passthrough{BEL}{ST}",
        f"{DCS}+q{rng.randbytes(8).hex()}{ST}",
        f"{DCS}{_params(rng)}|{'A' * rng.choice([0, 100, 70000])}{ST}",
        f"{DCS}1000p{ST}",
        DCS + "x" * 5000,  # never terminated here
    ]
    return rng.choice(forms)


def strings(rng: random.Random) -> str:
    """APC (kitty graphics among them), PM and SOS strings."""
    payload = base64.b64encode(rng.randbytes(rng.choice([0, 30, 4000]))).decode()
    intro = rng.choice([ESC + "_", ESC + "^", ESC + "X"])
    return f"{intro}Gf=100,a=T,i={rng.randrange(1 << 32)};{payload}{rng.choice([ST, BEL, ''])}"


def escapes(rng: random.Random) -> str:
    """Two-byte escapes, charsets, resets, 8-bit C1 controls as UTF-8, lone controls."""
    forms = [
        ESC + "c",
        ESC + "#8",
        ESC + "7" + ESC + "8",
        ESC + rng.choice("DEHMNOZ=>") + "x",
        ESC + rng.choice("()*+") + rng.choice("0AB<>%5"),
        "\x0e" + "lqkx" * 10 + "\x0f",
        "\u009b" + _params(rng) + "m",  # C1 CSI
        "\u009d0;c1 title\u009c",  # C1 OSC ... ST
        "\u0090$qm\u009c",  # C1 DCS
        "\x00\x7f\x08\x0b\x0c\x1a\x18\x05",
        ESC + ESC + "[" + ESC + "]",
        CSI + "\x00" + "1;2" + "\x1b" + "m",
        "\t" * rng.randrange(1, 50) + f"{CSI}{_num(rng)}I{CSI}{_num(rng)}Z{CSI}3g",
    ]
    return rng.choice(forms)


def text(rng: random.Random) -> str:
    """Wide, combining, zero-width and bidi characters, at the right edge too."""
    out = [f"{CSI}{rng.randrange(1, 60)};{rng.choice([1, 199, 200, 201, rng.randrange(300)])}H"]
    for _ in range(rng.randrange(1, 120)):
        kind = rng.randrange(6)
        if kind == 0:
            out.append(rng.choice(WIDE))
        elif kind == 1:
            out.append(rng.choice("aeoZ漢") + rng.choice(COMBINING) * rng.randrange(1, 300))
        elif kind == 2:
            out.append(rng.choice(COMBINING))  # with nothing to combine with
        elif kind == 3:
            out.append(rng.choice(ZERO_WIDTH))
        elif kind == 4:
            out.append(f"{CSI}{_params(rng)}m")
        else:
            out.append("".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(rng.randrange(80))))
    out.append(rng.choice(["\r\n", "\n", "\r", ""]))
    return "".join(out)


FAMILIES: tuple[Callable[[random.Random], str], ...] = (
    csi,
    modes,
    regions,
    window_ops,
    osc,
    dcs,
    strings,
    escapes,
    text,
    text,
)


def chunk(seed: int, n: int) -> bytes:
    """Chunk `n` of the stream for `seed`: about CHUNK bytes."""
    rng = random.Random(f"{seed}:{n}")
    out = bytearray()
    while len(out) < CHUNK:
        if rng.randrange(8) == 0:
            out += rng.choice(INVALID_UTF8)
        out += rng.choice(FAMILIES)(rng).encode("utf-8", "surrogatepass")
    return bytes(out)


def _drain_stdin() -> None:
    with open(0, "rb", buffering=0) as stdin:
        while stdin.read(1 << 16):
            pass


def main() -> None:
    seed = int(sys.argv[1])
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else None
    threading.Thread(target=_drain_stdin, daemon=True).start()
    written, n = 0, 0
    while limit is None or written < limit:
        data = chunk(seed, n)
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        written += len(data)
        n += 1


if __name__ == "__main__":
    main()
