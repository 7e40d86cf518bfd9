"""What every figure group gets: quick or full, and a short scratch directory of its own."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Context:
    quick: bool
    tmp: Path  # short: a tmux socket path must stay under the 108-byte UNIX socket limit
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def scratch(self, prefix: str) -> Path:
        """A fresh directory under the run's temp dir."""
        path = self.tmp / f"{prefix}{next(self._counter)}"
        path.mkdir(parents=True)
        return path

    def pick(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def seconds(self, quick: float, full: float) -> float:
        return quick if self.quick else full
