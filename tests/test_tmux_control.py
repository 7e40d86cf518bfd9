"""The control-mode reader and the screen parser, pure: hand-written byte streams as a
`tmux -C` client prints them (tmux(1) CONTROL MODE; the shapes copied from tmux 3.3a's own)."""

from __future__ import annotations

import pytest

from sidecar.pane.protocol import CommandFailed, ControlReader, Reply
from sidecar.pane.screen import parse_screen

ATTACHED = b"%begin 1795537161 264 0\n%end 1795537161 264 0\n%session-changed $0 main\n"


def feed_all(reader: ControlReader, *chunks: bytes) -> tuple[set[bytes], list[Reply]]:
    panes: set[bytes] = set()
    replies: list[Reply] = []
    for chunk in chunks:
        got_panes, got_replies = reader.feed(chunk)
        panes |= got_panes
        replies += got_replies
    return panes, replies


def test_the_attach_reply_is_not_ours_and_a_command_reply_is() -> None:
    stream = ATTACHED + b"%begin 1795537161 269 1\n12 3 200 50\n%end 1795537161 269 1\n"
    panes, replies = ControlReader().feed(stream)
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
    panes, replies = ControlReader().feed(stream)
    assert panes == {b"%1", b"%2", b"%3"}
    assert [r.lines for r in replies] == [(b"first",), ()]


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
    whole = ControlReader().feed(stream)
    cut = feed_all(ControlReader(), *(stream[i : i + size] for i in range(0, len(stream), size)))
    assert cut == whole
    panes, replies = cut
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
    panes, replies = ControlReader().feed(stream)
    assert panes == set()
    assert replies == [Reply(ok=True, lines=tuple(body), ours=True)]


def test_a_long_notification_split_over_many_reads_is_still_one_line() -> None:
    reader = ControlReader()
    panes, _ = reader.feed(b"%output %5 ")
    for _ in range(100):
        more, replies = reader.feed(b"y" * 10_000)
        assert (more, replies) == (set(), [])
    more, replies = reader.feed(b"\n%begin 3 3 1\nok\n%end 3 3 1\n")
    assert panes | more == {b"%5"}
    assert [r.lines for r in replies] == [(b"ok",)]


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
