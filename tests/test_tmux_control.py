"""The control-mode reader and the screen parser, pure: hand-written byte streams as a
`tmux -C` client prints them (tmux(1) CONTROL MODE; the shapes copied from tmux 3.3a's own),
and what one pane wrote taken out of them, unescaped (the recorder's tap)."""

from __future__ import annotations

import pytest

from sidecar.pane import protocol
from sidecar.pane.protocol import CommandFailed, ControlReader, Reply
from sidecar.pane.screen import parse_screen

ATTACHED = b"%begin 1795537161 264 0\n%end 1795537161 264 0\n%session-changed $0 main\n"


def feed_all(
    reader: ControlReader, *chunks: bytes, keep: bytes | None = None
) -> tuple[set[bytes], list[Reply], bytes]:
    panes: set[bytes] = set()
    replies: list[Reply] = []
    wrote = b""
    for chunk in chunks:
        got_panes, got_replies, got = reader.feed(chunk, keep)
        panes |= got_panes
        replies += got_replies
        wrote += got
    return panes, replies, wrote


def test_the_attach_reply_is_not_ours_and_a_command_reply_is() -> None:
    stream = ATTACHED + b"%begin 1795537161 269 1\n12 3 200 50\n%end 1795537161 269 1\n"
    panes, replies, _ = ControlReader().feed(stream)
    assert panes == set()
    assert replies == [
        Reply(ok=True, lines=(), ours=False),
        Reply(ok=True, lines=(b"12 3 200 50",), ours=True),
    ]


def test_output_notifications_between_replies_name_their_panes() -> None:
    stream = (
        b"%output %1 hello\\015\\012\n"
        b"%begin 7 30 1\nfirst\n%end 7 30 1\n"
        b"%extended-output %2 12 : x\n"
        b"%pause %1\n"
        b"%begin 7 31 1\n%end 7 31 1\n"
        b"%output %3 \\033[H\n"
    )
    panes, replies, wrote = ControlReader().feed(stream)
    assert panes == {b"%1", b"%2", b"%3"}
    assert [r.lines for r in replies] == [(b"first",), ()]
    assert wrote == b""  # no pane's bytes were asked for
    assert ControlReader().feed(stream, b"%1")[2] == b"hello\r\n"
    assert ControlReader().feed(stream, b"%2")[2] == b"x"
    assert ControlReader().feed(stream, b"%3")[2] == b"\x1b[H"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_a_stream_cut_anywhere_reads_the_same(size: int) -> None:
    stream = (
        ATTACHED
        + b"%output %0 abc\n"
        + b"%begin 9 40 1\nline one \xe6\x97\xa5\xe6\x9c\xac e\xcc\x81\n\nline three\n%end 9 40 1\n"
        + b"%output %4 "
        + b"x" * 5000
        + b"\n"
        + b"%begin 9 41 1\nafter\n%end 9 41 1\n"
    )
    whole = ControlReader().feed(stream, b"%4")
    chunks = [stream[i : i + size] for i in range(0, len(stream), size)]
    cut = feed_all(ControlReader(), *chunks, keep=b"%4")
    assert cut == whole
    panes, replies, wrote = cut
    assert wrote == b"x" * 5000
    assert panes == {b"%0", b"%4"}
    ours = [r for r in replies if r.ours]
    assert ours[0].lines == (b"line one \xe6\x97\xa5\xe6\x9c\xac e\xcc\x81", b"", b"line three")
    assert ours[1].lines == (b"after",)


def test_an_error_reply() -> None:
    stream = b"%begin 5 272 1\nparse error: unknown command: bogus\n%error 5 272 1\n"
    [reply] = ControlReader().feed(stream)[1]
    assert reply == Reply(ok=False, lines=(b"parse error: unknown command: bogus",), ours=True)
    assert reply.text() == "parse error: unknown command: bogus"


def test_body_lines_that_look_like_protocol_are_body() -> None:
    """capture-pane's lines are not escaped: a pane may show `%end ...`, `%output ...` or a
    `%begin`. Only `%end`/`%error` with this reply's own time, number and flags ends it."""
    body = [
        b"%end 1 2 1",
        b"%end 1795537177 270 0",  # the right time and number, other flags
        b"%error 1795537177 271 1",  # another number
        b"%end 1795537177 270 1 ",  # a trailing space
        b"x%end 1795537177 270 1",
        b"%output %9 not a notification",
        b"%begin 1795537177 270 1",
        b"%exit",
    ]
    stream = b"%begin 1795537177 270 1\n" + b"\n".join(body) + b"\n%end 1795537177 270 1\n"
    panes, replies, wrote = ControlReader().feed(stream, b"%9")
    assert panes == set() and wrote == b""
    assert replies == [Reply(ok=True, lines=tuple(body), ours=True)]


def test_a_long_notification_split_over_many_reads_is_still_one_line() -> None:
    reader = ControlReader()
    panes, _, _ = reader.feed(b"%output %5 ")
    for _ in range(100):
        more, replies, _ = reader.feed(b"y" * 10_000)
        assert (more, replies) == (set(), [])
    more, replies, _ = reader.feed(b"\n%begin 3 3 1\nok\n%end 3 3 1\n")
    assert panes | more == {b"%5"}
    assert [r.lines for r in replies] == [(b"ok",)]


def test_a_kept_panes_line_past_the_limit_loses_its_bytes_and_nothing_after_it() -> None:
    """An `%output` line longer than LINE cannot be kept whole: its bytes are counted lost and
    left out (never a head spliced to a tail), the next line is whole again."""
    reader = ControlReader()
    reader.feed(b"%output %0 ", b"%0")
    for _ in range(protocol.LINE // 65536 + 2):
        assert reader.feed(b"z" * 65536, b"%0")[2] == b""
    panes, _, wrote = reader.feed(b"tail\n%output %0 next\\134\n", b"%0")
    assert panes == {b"%0"} and wrote == b"next\\"
    assert reader.lost > protocol.LINE // 2


def test_unescape_reads_exactly_tmuxs_escapes() -> None:
    raw = bytes(range(256)) + "漢 \\ é".encode()
    escaped = b"".join(b"\\%03o" % b if b < 32 or b == 92 else bytes([b]) for b in raw)
    assert protocol.unescape(escaped) == raw


# ---- the screen from the replies -------------------------------------------------------------


def reply(*lines: bytes, ok: bool = True) -> Reply:
    return Reply(ok=ok, lines=lines, ours=True)


def test_parse_screen_pads_to_the_rows_and_decodes_utf8() -> None:
    screen = parse_screen(reply(b"200 4 7 1"), reply("日本 e\u0301".encode(), b"ready>"))
    assert (screen.rows, screen.cols) == (4, 200)
    assert screen.lines == ("日本 e\u0301", "ready>", "", "")
    assert (screen.cursor_row, screen.cursor_col) == (1, 7)


def test_parse_screen_refuses_an_error_or_a_strange_size() -> None:
    with pytest.raises(CommandFailed, match="can't find pane"):
        parse_screen(reply(b"can't find pane: %7", ok=False), reply())
    with pytest.raises(CommandFailed, match="size"):
        parse_screen(reply(b"200 x"), reply())
