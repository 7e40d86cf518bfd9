"""The needlecast message format: the boundary rule, escaping, bad input
(sidecar.workspace.needlecast, sidecar.workspace.needlecast_bounds).

Some tests go through a Mailbox: what the rule promises is seen when appending and acking."""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile

import msgspec
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.api.messages import message_answer
from sidecar.core.contract import MESSAGE_TYPES
from sidecar.workspace import needlecast, needlecast_bounds
from sidecar.workspace.mailbox import Mailbox, RemoveResult
from sidecar.workspace.needlecast import Message, parse_messages, render_messages
from tests.needlecast_samples import SEED, box_file, msg

# ---------------------------------------------------------------- format


def test_seed_example_parses_as_a_human_reads_it() -> None:
    result = parse_messages(SEED)
    assert result.warnings == ()
    first, second = result.messages
    # As the API shows it (GET /inbox, /outbox).
    assert msgspec.to_builtins(message_answer(first)) == {
        "id": "msg-abc123",
        "from": "bob",
        "to": "alice",
        "thread": "auth-help",
        "type": "question",
        "content": "Need help understanding the JWT implementation.\nCan you review my approach?",
        "timestamp": "2026-01-21T10:00:00Z",
    }
    assert second.thread is None
    assert second.body == "Please prioritize the authentication module."


def test_crlf_hand_written_file_parses_like_the_lf_one() -> None:
    result = parse_messages(SEED.replace("\n", "\r\n"))
    assert result.warnings == ()
    assert [m.body for m in result.messages] == [
        "Need help understanding the JWT implementation.\r\nCan you review my approach?",
        "Please prioritize the authentication module.",
    ]
    assert result.messages[0].id == "msg-abc123"


TRICKY_BODIES = [
    "",
    "\n",
    "\n\n\n",
    "no trailing newline",
    "---",
    "---\nid: fake\n---\nnot a header",
    "a\n---\nb",
    "\\---\n\\\\---\n--- \n---\t\r\n",
    "```yaml\n---\nid: x\ntype: task\n---\n```\n",
    "crlf\r\nlines\r\n",
    "lone cr\r",
    "unicode ✓ 日本語 🚀\u2028\u2029\x85",
    "key: value\nother: [1, 2]\n",
    "ends with blank lines\n\n",
]


@pytest.mark.parametrize("body", TRICKY_BODIES)
def test_tricky_body_round_trips(body: str) -> None:
    messages = [msg("msg-1", body), msg("msg-2", body, to="bob", thread="t")]
    result = parse_messages(render_messages(messages))
    assert result.warnings == ()
    assert list(result.messages) == messages


header_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="\u2028\u2029\ufeff"),
    min_size=1,
    max_size=20,
)
messages_strategy = st.lists(
    st.builds(
        Message,
        id=header_text,
        sender=st.none() | header_text,
        type=st.none() | st.sampled_from(sorted(MESSAGE_TYPES)) | header_text,
        time=st.none() | header_text,
        body=st.text()
        | st.lists(
            st.sampled_from(["---", "\\---", "--- ", "---\r", "id: x", "", "\r", "text", "\\"])
        ).map("\n".join),
        to=st.none() | header_text,
        thread=st.none() | header_text,
    ),
    max_size=8,
)


@given(messages_strategy)
@settings(max_examples=300, deadline=None)
def test_any_messages_write_then_read_gives_the_same_messages(messages: list[Message]) -> None:
    result = parse_messages(render_messages(messages))
    assert list(result.messages) == messages
    # Warnings only for what the writer was asked to write (unknown types, missing fields,
    # duplicate ids), never for the format itself.
    assert not any("skipped" in w or "outside" in w for w in result.warnings)


@given(messages_strategy)
@settings(max_examples=60, deadline=None)
def test_any_messages_appended_to_a_file_then_read_are_the_same(messages: list[Message]) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # hypothesis runs many examples per test call
        box = Mailbox(pathlib.Path(tmp), "outbox")
        for message in messages:
            box.append(message)
        assert list(box.read().messages) == messages
        if messages:  # and removing one keeps exactly the others
            same_id = sum(m.id == messages[0].id for m in messages)
            assert box.remove([messages[0].id]).removed == same_id
            assert list(box.read().messages) == [m for m in messages if m.id != messages[0].id]


@given(st.from_regex(needlecast._PLAIN, fullmatch=True))
@settings(max_examples=300)
def test_fast_path_values_read_the_same_as_yaml_would(value: str) -> None:
    header = f"id: {value}\n"
    fast, _, _ = needlecast._load_header(header, True)
    assert needlecast_bounds.layout(f"---\n{header}---\n".encode()).segment(0).fast
    slow = yaml.load(header, Loader=needlecast._HeaderLoader)
    assert fast is not None
    assert needlecast._field(fast, "id") == needlecast._field(slow, "id")


def test_hand_written_timestamps_pass_through_as_written_even_impossible_ones() -> None:
    text = "---\nid: m1\nfrom: x\ntype: task\ntime: 2026-02-31 10:00:00+01:00\n---\nhi\n"
    result = parse_messages(text)
    assert result.warnings == ()
    assert result.messages[0].time == "2026-02-31 10:00:00+01:00"


def test_hand_written_numbers_and_yaml_words_stay_as_written() -> None:
    text = "---\nid: 0x1F\nfrom: 007\nto: yes\nthread: 1.50\ntype: task\ntime: 1\n---\nhi\n"
    (m,) = parse_messages(text).messages
    assert (m.id, m.sender, m.to, m.thread, m.time) == ("0x1F", "007", "yes", "1.50", "1")


def test_markdown_rule_in_hand_written_body_stays_in_the_body() -> None:
    text = SEED.replace("Can you review my approach?", "Part one\n---\n\nPart two")
    result = parse_messages(text)
    assert result.warnings == ()
    assert result.messages[0].body.endswith("Part one\n---\n\nPart two")


# ---------------------------------------------------------------- bad input


def test_malformed_yaml_is_reported_with_its_line_and_neighbours_still_read() -> None:
    bad = "---\nid: msg-bad\nfrom: [unclosed\ntype: task\n---\nbody\n\n"
    text = render_messages([msg("msg-1")]) + bad + render_messages([msg("msg-3")])
    result = parse_messages(text)
    assert [m.id for m in result.messages] == ["msg-1", "msg-3"]
    assert len(result.warnings) == 1
    assert result.warnings[0].startswith("line ")
    line = int(result.warnings[0].split(":")[0].removeprefix("line "))
    assert 9 <= line <= 13  # the broken message sits on lines 9-15
    assert "malformed YAML" in result.warnings[0]


def test_missing_id_is_reported_and_the_message_gets_a_stable_ackable_id(
    tmp_path: pathlib.Path,
) -> None:
    text = "---\nfrom: bob\ntype: task\ntime: 2026-01-21T10:00:00Z\n---\nno id here\n"
    result = parse_messages(text)
    (message,) = result.messages
    assert message.id.startswith("noid-")
    assert message.body == "no id here"
    assert any("no id" in w and w.startswith("line 1:") for w in result.warnings)
    assert parse_messages(text).messages[0].id == message.id
    box = box_file(tmp_path, text + render_messages([msg("msg-2")]))
    assert box.remove([message.id]).removed == 1
    assert [m.id for m in box.read().messages] == ["msg-2"]


def test_duplicate_ids_are_both_listed_and_reported() -> None:
    text = render_messages([msg("msg-1", "a"), msg("msg-2"), msg("msg-1", "b")])
    result = parse_messages(text)
    assert [m.body for m in result.messages if m.id == "msg-1"] == ["a", "b"]
    assert result.warnings == ("line 17: duplicate id msg-1 (first at line 1)",)


def test_unknown_type_and_missing_fields_are_reported_not_dropped() -> None:
    text = "---\nid: m1\ntype: gossip\n---\nhi\n"
    result = parse_messages(text)
    assert [m.id for m in result.messages] == ["m1"]
    assert any("unknown type 'gossip'" in w for w in result.warnings)
    assert any("no 'from'" in w for w in result.warnings)


def test_unterminated_header_and_stray_text_are_reported() -> None:
    text = "stray words\n" + render_messages([msg("msg-1")]) + "---\nid: msg-2\nfrom: x\n"
    result = parse_messages(text)
    assert [m.id for m in result.messages] == ["msg-1"]
    assert any(w.startswith("line 1:") and "outside" in w for w in result.warnings)
    assert any("never closed" in w for w in result.warnings)


def test_binary_garbage_gives_warnings_never_an_exception(tmp_path: pathlib.Path) -> None:
    garbage = bytes(range(256)) * 64 + b"\n---\n\xff\xfe: \x00\n---\n\x80"
    second = b"---\nid: msg-2\nfrom: \xff\ntype: task\n---\n" + garbage + b"\n\n"
    box = box_file(tmp_path, garbage + b"\n" + render_messages([msg("msg-1")]).encode() + second)
    result = box.read()
    assert [m.id for m in result.messages] == ["msg-1", "msg-2"]
    assert result.messages[1].sender == "\ufffd"
    assert any("not UTF-8" in w for w in result.warnings)
    assert any("outside any message" in w for w in result.warnings)
    # The garbage stays byte for byte when a neighbour is acked.
    assert box.remove(["msg-1"]).removed == 1
    assert box.path.read_bytes() == garbage + b"\n" + second


def test_remove_keeps_every_other_byte_of_a_hand_written_file(tmp_path: pathlib.Path) -> None:
    box = box_file(tmp_path, SEED)
    result = box.remove(["msg-abc123", "msg-nope"])
    assert result == RemoveResult(removed=1, unknown=("msg-nope",))
    assert box.path.read_text() == SEED[SEED.index("---\nid: msg-abc124") :]


def test_append_after_a_last_line_without_newline_keeps_both_messages(
    tmp_path: pathlib.Path,
) -> None:
    box = box_file(tmp_path, SEED.rstrip("\n"))
    box.append(msg("msg-new", "---\nsneaky"))
    result = box.read()
    assert result.warnings == ()
    assert [m.body for m in result.messages][1:] == [
        "Please prioritize the authentication module.",
        "---\nsneaky",
    ]


UNCLOSED_AT_END = "---\nid: x\nfrom: y\ntype: task\n"  # a writer killed before its closing ---


def test_unclosed_header_at_the_end_does_not_swallow_the_next_append(
    tmp_path: pathlib.Path,
) -> None:
    first, new = msg("msg-1"), msg("msg-new", "---\nid: fake\n---\nbody")
    box = box_file(tmp_path, render_messages([first]) + UNCLOSED_AT_END)
    box.append(new)
    result = box.read()
    assert list(result.messages) == [first, new]
    (warning,) = result.warnings
    assert warning.startswith("line 9: header is never closed")
    # `x` is no message: acking it removes nothing (it used to remove msg-new with it).
    assert box.remove(["x"]) == RemoveResult(0, ("x",))
    assert box.remove(["msg-new"]).removed == 1
    assert box.path.read_text() == render_messages([first]) + UNCLOSED_AT_END + "\n"


def test_unclosed_header_at_the_end_then_a_foreign_append_keeps_both(
    tmp_path: pathlib.Path,
) -> None:
    """A writer that ignores the lock and the blank line (`cat msg.md >> outbox.md`)."""
    box = box_file(tmp_path, render_messages([msg("msg-1")]) + UNCLOSED_AT_END)
    with open(box.path, "a") as f:
        f.write(render_messages([msg("msg-new")]))
    result = box.read()
    assert list(result.messages) == [msg("msg-1"), msg("msg-new")]
    assert result.warnings == (
        "line 9: header is never closed by a '---' line (line 13 starts another header); skipped",
    )


BROKEN_HEADERS = {
    "valid YAML": UNCLOSED_AT_END,
    "invalid YAML": "---\nid: x\nfrom: [y\ntype: task\n",
    "body without its ---": "---\nid: x\nfrom: y\nforgot the separator: this is the body\nok\n\n",
    "blank line in it": "---\nid: x\n\nfrom: y\n---\nbody\n\n",
    "CRLF": UNCLOSED_AT_END.replace("\n", "\r\n"),
    "no id": "---\nfrom: y\ntype: task\n",
}


@pytest.mark.parametrize("broken", BROKEN_HEADERS.values(), ids=BROKEN_HEADERS.keys())
def test_unclosed_header_mid_file_is_reported_and_its_neighbours_read_and_acked_alone(
    tmp_path: pathlib.Path, broken: str
) -> None:
    before, after = render_messages([msg("msg-1")]), render_messages([msg("msg-3", "key: v")])
    text = before + broken + after
    result = parse_messages(text)
    assert list(result.messages) == [msg("msg-1"), msg("msg-3", "key: v")]
    (warning,) = result.warnings
    assert warning.startswith("line 9: header is never closed")
    data = text.encode()
    assert needlecast.message_ids(data) == needlecast.parse_bytes(data)[1]
    box = box_file(tmp_path, text)
    assert box.remove(["msg-3"]).removed == 1
    assert box.path.read_bytes() == (before + broken).encode()
    assert box.remove(["msg-1"]).removed == 1
    assert box.path.read_bytes() == broken.encode()


def test_unclosed_header_before_a_hand_written_message_without_id() -> None:
    text = (
        render_messages([msg("msg-1")]) + UNCLOSED_AT_END + "---\nfrom: bob\ntype: task\n---\nhi\n"
    )
    result = parse_messages(text)
    assert [m.sender for m in result.messages] == ["alice", "bob"]
    assert result.messages[1].body == "hi"
    assert any(w.startswith("line 9: header is never closed") for w in result.warnings)


def test_body_rule_right_after_a_key_value_body_line_stays_in_the_body() -> None:
    """A chain with a separator left over and no contract field in its last header pairs up
    from the start: `Status: done` underlined is a markdown heading, not a header."""
    text = "---\nid: m1\nfrom: x\ntype: task\ntime: t\n---\nStatus: done\n---\nmore\n\n"
    text += render_messages([msg("msg-2")])
    result = parse_messages(text)
    assert result.warnings == ()
    assert [m.body for m in result.messages] == ["Status: done\n---\nmore", "hello"]


@pytest.mark.parametrize("ending", ["", "\n", "\r\n", "\r", "\n\n", "\r\n\r\n", "\n\r\n"])
def test_append_ends_a_hand_written_file_with_a_blank_line_and_its_last_body_reads_the_same(
    tmp_path: pathlib.Path, ending: str
) -> None:
    box = box_file(tmp_path, SEED + "last line" + ending)
    before = box.read().messages
    box.append(msg("msg-new"))
    assert box.path.read_bytes().endswith(render_messages([msg("msg-new")]).encode())
    assert box.read().messages == (*before, msg("msg-new"))
    assert box.read().warnings == ()


def test_render_refuses_header_values_that_would_break_the_file() -> None:
    with pytest.raises(ValueError, match="one line"):
        render_messages([msg("msg-1", to="a\nid: b")])
    with pytest.raises(ValueError, match="needs an id"):
        render_messages([msg("")])


LINES = [
    "---", "--- ", "---\r", "----", "\\---", "id: a", "id: b", "id: yes", "id:", "idx: q",
    "from: x", "from: [x", "type: task", "to: null", "a: b: c", "x:y", "text", "", " ", "ü: x",
    "id: 'q'", "time: 2026-01-01T00:00:00Z", "  - x", "# c", "- y", "Status: done",
]  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from(LINES), st.sampled_from(["\n", "\r\n"])), max_size=16))
@settings(max_examples=400)
def test_quick_id_scan_for_acks_agrees_with_the_full_parse(lines: list[tuple[str, str]]) -> None:
    data = "".join(line + end for line, end in lines).encode()
    assert needlecast.message_ids(data) == needlecast.parse_bytes(data)[1]


garbage_strategy = st.lists(
    st.tuples(st.sampled_from(LINES), st.sampled_from(["\n", "\r\n"])), max_size=8
).map(lambda lines: "".join(line + end for line, end in lines))


@given(messages_strategy, st.lists(garbage_strategy, min_size=9, max_size=9))
@settings(max_examples=400, deadline=None)
def test_text_between_written_messages_never_loses_one(
    messages: list[Message], garbage: list[str]
) -> None:
    """Any lines (unclosed headers, stray ---, key lines...) before, between and after written
    messages: each written message is still read, in order, with its header as written and its
    body as written (then the text after it when that text holds no message)."""
    text = "".join(garbage[k] + render_messages([m]) for k, m in enumerate(messages))
    text += garbage[len(messages)]
    result = parse_messages(text)
    read = iter(result.messages)
    for k, m in enumerate(messages):
        exact = garbage[k + 1] == ""
        assert any(
            dataclasses.replace(r, body=m.body) == m
            and (r.body == m.body if exact else r.body.startswith(m.body))
            for r in read
        ), (m, result)
    data = text.encode()
    assert needlecast.message_ids(data) == needlecast.parse_bytes(data)[1]
