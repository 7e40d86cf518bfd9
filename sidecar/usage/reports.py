"""One model request's usage as a CLI reports it, checked: counts a real request can have, a cost
that is a number of dollars. A report out of those bounds is refused whole."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sidecar.core.text import one_line

# Bounds no real request reaches (context windows are ~10^6 tokens; a request costs dollars, not
# thousands of them): a report past them is forged or broken, and would ruin every total.
MAX_TOKENS = 10_000_000
MAX_COST_USD = 1000.0
MAX_MODEL = 100  # characters of a model's name kept
KINDS = ("input", "output", "cache_read", "cache_creation")


class BadReport(ValueError):
    """A usage report that cannot be counted; the message says why."""


@dataclass(frozen=True)
class UsageReport:
    model: str
    input: int
    output: int
    cache_read: int
    cache_creation: int
    cost_usd: float | None  # None: the CLI gave no cost (priced from the table)

    @property
    def tokens(self) -> int:
        return self.input + self.output + self.cache_read + self.cache_creation


def count(value: object, name: str) -> int:
    """A token count: a whole number from 0 to MAX_TOKENS (OTLP JSON may send it as a string)."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{name} is not a whole number: {value!r}"
        raise BadReport(msg)
    if not 0 <= value <= MAX_TOKENS:
        msg = f"{name} {value} is out of bounds (0 to {MAX_TOKENS})"
        raise BadReport(msg)
    return value


def dollars(value: object, name: str) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            msg = f"{name} is not a number: {value!r}"
            raise BadReport(msg) from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"{name} is not a number: {value!r}"
        raise BadReport(msg)
    if not math.isfinite(value) or not 0 <= value <= MAX_COST_USD:
        msg = f"{name} {value} is out of bounds (0 to {MAX_COST_USD:g})"
        raise BadReport(msg)
    return float(value)


def model_name(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        return "unknown"
    return one_line(value, MAX_MODEL)
