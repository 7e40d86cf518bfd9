"""The masks of the secrets' real values (`sidecar.core.masks`): a value becomes
`[secret:<name>]` wherever the sidecar's text leaves it, as written and as JSON escapes it; the
log formatter, the event stream and the audit encoder pass through them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from sidecar.core import masks
from sidecar.core.event_shapes import ErrorEvent
from sidecar.core.events import encode_line
from sidecar.core.logs import JsonFormatter

VALUE = 'sk-"quoted"\\value-0123'
OTHER = "ghp_other0123456789"


@pytest.fixture
def installed() -> Iterator[None]:
    masks.install({VALUE: "api", OTHER: "git"})
    yield
    masks.install({})


def test_a_value_is_masked_as_written_and_as_json_writes_it(installed: None) -> None:
    assert masks.scrub_text(f"key={VALUE}; {OTHER}.") == "key=[secret:api]; [secret:git]."
    escaped = json.dumps({"said": f"x {VALUE} y"}).encode()
    assert masks.scrub(escaped) == b'{"said": "x [secret:api] y"}'


def test_nothing_changes_without_secrets() -> None:
    assert masks.scrub(b"anything " + VALUE.encode()) == b"anything " + VALUE.encode()


def test_logs_and_events_never_carry_a_value(installed: None) -> None:
    record = logging.LogRecord("t", logging.WARNING, "f", 1, "upstream said %s", (VALUE,), None)
    line = JsonFormatter().format(record)
    assert VALUE not in line and json.loads(line)["msg"] == "upstream said [secret:api]"
    event = encode_line(ErrorEvent(message=f"CLI printed {OTHER}"))
    assert OTHER.encode() not in event and b"[secret:git]" in event
