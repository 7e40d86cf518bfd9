"""The pinned price table: US dollars per million tokens, for a CLI that reports its tokens but no
cost. A model is priced by the longest prefix of its name listed here; one the table does not
know costs 0 and says so (`cost_from: "unknown"`). The figures are the providers' list prices
for the standard tier (each block names its source and date); a CLI's own figure always wins.
"""

from __future__ import annotations

from typing import NamedTuple

from sidecar.usage.reports import UsageReport


class Price(NamedTuple):
    """USD per million tokens: input, output, cache read, cache creation (write)."""

    input: float
    output: float
    cache_read: float
    cache_creation: float


PRICES_AS_OF = "2026-09"  # the newest block's date
PRICES: dict[str, Price] = {
    # Anthropic, 2025-11 (cache creation: the 5-minute cache's write price)
    "claude-opus-4-5": Price(5.0, 25.0, 0.50, 6.25),
    "claude-opus-4": Price(15.0, 75.0, 1.50, 18.75),
    "claude-sonnet-4": Price(3.0, 15.0, 0.30, 3.75),
    "claude-3-7-sonnet": Price(3.0, 15.0, 0.30, 3.75),
    "claude-haiku-4-5": Price(1.0, 5.0, 0.10, 1.25),
    "claude-3-5-haiku": Price(0.80, 4.0, 0.08, 1.0),
    # OpenAI, 2025-11 (cached input is the cache read; no charge to write the cache)
    "gpt-5-mini": Price(0.25, 2.0, 0.025, 0.0),
    "gpt-5-nano": Price(0.05, 0.40, 0.005, 0.0),
    "gpt-5": Price(1.25, 10.0, 0.125, 0.0),
    "gpt-4.1-mini": Price(0.40, 1.60, 0.10, 0.0),
    "gpt-4.1": Price(2.0, 8.0, 0.50, 0.0),
    "o4-mini": Price(1.10, 4.40, 0.275, 0.0),
    "o3": Price(2.0, 8.0, 0.50, 0.0),
    # Google, 2025-11 (prompts up to 200k tokens)
    "gemini-2.5-pro": Price(1.25, 10.0, 0.31, 0.0),
    "gemini-2.5-flash-lite": Price(0.10, 0.40, 0.025, 0.0),
    "gemini-2.5-flash": Price(0.30, 2.50, 0.075, 0.0),
    # Google, 2026-09: ai.google.dev/gemini-api/docs/pricing, paid tier, prompts up to 200k
    # tokens (Gemini CLI 0.61's default model is gemini-3.1-pro-preview); cached input is a tenth
    # of the input price; no charge to write the implicit cache.
    "gemini-3.1-pro": Price(2.0, 12.0, 0.20, 0.0),
    "gemini-3-pro": Price(2.0, 12.0, 0.20, 0.0),
    "gemini-3.1-flash-lite": Price(0.25, 1.50, 0.025, 0.0),
}


def price_of(model: str) -> Price | None:
    """The entry whose name is the longest prefix of `model` (case-insensitive; a provider's
    prefix such as `anthropic/` is ignored)."""
    name = model.lower().rsplit("/", 1)[-1]
    best = max((p for p in PRICES if name.startswith(p)), key=len, default=None)
    return PRICES[best] if best is not None else None


def cost(report: UsageReport) -> float | None:
    """What `report` costs by the table; None for a model it does not know."""
    price = price_of(report.model)
    if price is None:
        return None
    return (
        report.input * price.input
        + report.output * price.output
        + report.cache_read * price.cache_read
        + report.cache_creation * price.cache_creation
    ) / 1_000_000
