"""The budget's rule, pure: how much of the sleeve's limit is spent, and what level that is.
`tokens` counts every token the model processed (input, output, cache read, cache creation)."""

from __future__ import annotations

from typing import Literal

from sidecar.core.contract import BUDGET_WARN_AT

Level = Literal["none", "ok", "warning", "exceeded"]


def spent_share(
    usd: float | None, tokens: int | None, spent_usd: float, spent_tokens: int
) -> float | None:
    """The largest share of a limit spent (1.0: a limit reached); None without a limit."""
    shares = []
    if usd is not None:
        shares.append(spent_usd / usd)
    if tokens is not None:
        shares.append(spent_tokens / tokens)
    return max(shares) if shares else None


def level(share: float | None) -> Level:
    if share is None:
        return "none"
    if share >= 1.0:
        return "exceeded"
    return "warning" if share >= BUDGET_WARN_AT else "ok"


def describe(usd: float | None, tokens: int | None, spent_usd: float, spent_tokens: int) -> str:
    """What is spent of which limit, for a person: `$1.2345 of $1.00, 12,345 of 10,000 tokens`."""
    parts = []
    if usd is not None:
        parts.append(f"${spent_usd:.4f} of ${usd:g} (SIDECAR_BUDGET_USD)")
    if tokens is not None:
        parts.append(f"{spent_tokens:,} of {tokens:,} tokens (SIDECAR_BUDGET_TOKENS)")
    return ", ".join(parts) or "no limit"
