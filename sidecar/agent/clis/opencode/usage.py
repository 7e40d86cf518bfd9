"""opencode's usage (1.18.33), from its own event stream: every model request ends in a
`message.part.updated` event whose part is a `step-finish` with that request's `tokens` and the
`cost` opencode computed; the model is its message's (`message.updated`, an assistant's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.agent.event_stream import Event
from sidecar.usage.reports import UsageReport, count, dollars, model_name

# Measured on 1.18.33 against a Chat Completions stub answering 1 prompt and 1 completion token:
#   {"type": "message.part.updated", "properties": {"part": {"id": "prt_…", "messageID": "msg_…",
#    "type": "step-finish", "reason": "tool-calls", "cost": 0, "tokens": {"total": 2,
#    "input": 1, "output": 1, "reasoning": 0, "cache": {"write": 0, "read": 0}}}}}
# Its `input` leaves out the cached tokens (counted in `cache`), and its `output` leaves out the
# reasoning tokens (its own code: output = outputTokens - reasoningTokens): both are billed as
# output, so they are counted together. Its `cost` comes from its model catalogue and is 0 for
# a model it has no price for (a custom provider's): then the pinned price table prices it.
KEPT = 512  # messages and parts remembered: a bounded memory of what was already counted


def _remember(seen: dict[str, str], key: str, value: str) -> None:
    seen[key] = value
    if len(seen) > KEPT:
        del seen[next(iter(seen))]  # the oldest


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class Bill:
    """The model requests of one run, each counted once (an event sent twice is not)."""

    def __init__(self) -> None:
        self.models: dict[str, str] = {}  # assistant message id -> its model
        self.counted: dict[str, str] = {}  # step-finish part ids already read

    def read(self, event: Event) -> UsageReport | None:
        props = _object(event.get("properties"))
        if event.get("type") == "message.updated":
            info = _object(props.get("info"))
            if info.get("role") == "assistant" and isinstance(info.get("id"), str):
                _remember(self.models, info["id"], model_name(info.get("modelID")))
            return None
        part = _object(props.get("part"))
        if event.get("type") != "message.part.updated" or part.get("type") != "step-finish":
            return None
        key = part.get("id")
        if not isinstance(key, str) or key in self.counted:
            return None
        _remember(self.counted, key, "")
        tokens = _object(part.get("tokens"))
        cache = _object(tokens.get("cache"))
        cost = dollars(part.get("cost", 0), "cost")
        return UsageReport(
            model=self.models.get(str(part.get("messageID")), "unknown"),
            input=count(tokens.get("input", 0), "tokens.input"),
            output=count(tokens.get("output", 0), "tokens.output")
            + count(tokens.get("reasoning", 0), "tokens.reasoning"),
            cache_read=count(cache.get("read", 0), "tokens.cache.read"),
            cache_creation=count(cache.get("write", 0), "tokens.cache.write"),
            cost_usd=cost or None,
        )
