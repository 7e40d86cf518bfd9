"""Figures, targets and the statistics behind them; the A/B interleaving every baseline uses.

A figure is a list of samples (its value is their median, its spread the interquartile range)
plus, where the issue names one, a baseline's samples taken in the same run, interleaved.
"""

from __future__ import annotations

import logging
import math
import operator
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

Sample = float | Mapping[str, float]
_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


@dataclass(frozen=True)
class Check:
    """One condition of a target: `what` (value or ratio) `op` `limit`."""

    what: str  # "value" or "ratio"
    op: str  # "<=" or ">="
    limit: float


@dataclass(frozen=True)
class Target:
    text: str
    checks: tuple[Check, ...] = ()


REPORT = Target("report")


def at_most(limit: float, text: str) -> Target:
    return Target(text, (Check("value", "<=", limit),))


def ratio_at_least(limit: float, text: str) -> Target:
    return Target(text, (Check("ratio", ">=", limit),))


def ratio_at_most(limit: float, text: str) -> Target:
    return Target(text, (Check("ratio", "<=", limit),))


def median(samples: list[float]) -> float | None:
    return statistics.median(samples) if samples else None


def iqr(samples: list[float]) -> tuple[float, float] | None:
    """Interquartile range (inclusive method); None below two samples."""
    if len(samples) < 2:
        return None
    q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q3


@dataclass
class Baseline:
    label: str
    samples: list[float]

    @property
    def value(self) -> float | None:
        return median(self.samples)


@dataclass
class Figure:
    name: str  # stable key in the JSON, e.g. "start.health"
    label: str  # what the table says
    unit: str
    samples: list[float]
    baseline: Baseline | None = None
    target: Target = REPORT
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def value(self) -> float | None:
        return median(self.samples)

    @property
    def ratio(self) -> float | None:
        base = self.baseline.value if self.baseline else None
        if self.value is None or not base:
            return None
        return self.value / base

    @property
    def met(self) -> str:
        if self.error is not None or self.value is None:
            return "n/a"
        if not self.target.checks:
            return "report"
        for check in self.target.checks:
            got = self.value if check.what == "value" else self.ratio
            if got is None or not _OPS[check.op](got, check.limit):
                return "no"
        return "yes"

    def as_json(self) -> dict[str, Any]:
        spread = iqr(self.samples)
        out: dict[str, Any] = {
            "label": self.label,
            "unit": self.unit,
            "value": _clean(self.value),
            "spread_iqr": None if spread is None else [_clean(v) for v in spread],
            "min": _clean(min(self.samples)) if self.samples else None,
            "max": _clean(max(self.samples)) if self.samples else None,
            "n": len(self.samples),
            "samples": [_clean(s) for s in self.samples],
            "baseline": None,
            "ratio": _clean(self.ratio),
            "target": self.target.text,
            "met": self.met,
            "notes": self.notes,
            **self.extra,
        }
        if self.baseline is not None:
            out["baseline"] = {
                "label": self.baseline.label,
                "value": _clean(self.baseline.value),
                "spread_iqr": (
                    None if (b := iqr(self.baseline.samples)) is None else [_clean(v) for v in b]
                ),
                "samples": [_clean(s) for s in self.baseline.samples],
            }
        if self.error is not None:
            out["error"] = self.error
        return out


def _clean(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


def fmt(value: float | None) -> str:
    """Three significant digits, no exponent for the magnitudes that occur here."""
    if value is None:
        return "–"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    digits = max(0, 2 - math.floor(math.log10(magnitude)))
    return f"{value:.{digits}f}"


def interleave(
    rounds: int, arms: Mapping[str, Callable[[], Sample]], warmup: int = 1
) -> dict[str, list[float]]:
    """Run the arms A B C A B C ... for `rounds` rounds after `warmup` discarded ones.

    An arm returns one number or a mapping of numbers; samples are keyed by arm name, or
    `arm.key` for a mapping. Interleaving spreads the machine's noise evenly over the arms.
    """
    out: dict[str, list[float]] = {}
    for n in range(warmup + rounds):
        for name, arm in arms.items():
            got = arm()
            if n < warmup:
                continue
            if isinstance(got, Mapping):
                for key, value in got.items():
                    out.setdefault(f"{name}.{key}", []).append(float(value))
            else:
                out.setdefault(name, []).append(float(got))
        log.debug("round %d/%d done", n + 1, warmup + rounds)
    return out


COLUMNS = (
    "figure",
    "value (median)",
    "spread (IQR)",
    "baseline (median)",
    "ratio",
    "target",
    "met?",
)


def table(figures: list[Figure]) -> str:
    """The markdown table `scripts/bench` prints and docs/benchmarks.md shows."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for f in figures:
        spread = iqr(f.samples)
        unit = f" {f.unit}" if f.unit else ""
        base = "–"
        if f.baseline is not None:
            base = f"{fmt(f.baseline.value)}{unit} ({f.baseline.label})"
        value = f"{fmt(f.value)}{unit}" if f.error is None else f"error: {f.error[:60]}"
        cells = [
            f.label,
            value,
            "–" if spread is None else f"{fmt(spread[0])}–{fmt(spread[1])}",
            base,
            "–" if f.ratio is None else f"{f.ratio:.2f}×",
            f.target.text,
            f.met,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
