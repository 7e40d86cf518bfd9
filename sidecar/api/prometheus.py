"""The Prometheus text exposition format (0.0.4), written by hand, and the `process_*` metrics
prometheus-client's process collector would give: what any exporter needs, nothing of the
sidecar's own families (`sidecar.api.metrics`).
"""

from __future__ import annotations

import functools
import os
import resource
import time
from collections.abc import Iterable

from sidecar.core.proc import start_time

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROCESS_EVERY = 1.0  # seconds: how old the process_* families of a scrape may be
Labels = tuple[tuple[str, str], ...]


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


@functools.cache
def _header(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}"


@functools.cache
def _one_prefix(name: str, kind: str, doc: str) -> str:
    return f"{_header(name, kind, doc)}\n{name} "


@functools.lru_cache(maxsize=1024)  # bounded sets: states, routes, exit codes, CLI names
def _series(name: str, labels: tuple[tuple[str, str], ...]) -> str:
    """`name{label="value",...}`, escaped as the format wants."""
    pairs = ",".join(f'{k}="{_label_value(v)}"' for k, v in labels)
    return f"{name}{{{pairs}}}"


@functools.cache
def _one_hot_lines(name: str, current: str, values: tuple[str, ...]) -> str:
    return "\n".join(f"{_series(name, (('state', v),))} {int(v == current)}" for v in values)


class Exposition:
    """Families in the order they are added, rendered to the text format. What does not change
    between scrapes (headers, label sets, the series of a state) is made once and reused."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(
        self, name: str, kind: str, doc: str, samples: Iterable[tuple[Labels, float]]
    ) -> None:
        """A family with labelled samples (`Labels`: (name, value) pairs, in order)."""
        self.lines.append(_header(name, kind, doc))
        self.lines.extend(f"{_series(name, labels)} {_number(value)}" for labels, value in samples)

    def one(self, name: str, kind: str, doc: str, value: float) -> None:
        """A family of one sample without labels."""
        self.lines.append(_one_prefix(name, kind, doc) + _number(value))

    def summary(self, name: str, doc: str, count: int, total: float) -> None:
        """A summary without quantiles: how many, and their sum."""
        self.lines.append(_header(name, "summary", doc))
        self.lines.append(f"{name}_count {count}")
        self.lines.append(f"{name}_sum {_number(total)}")

    def one_hot(self, name: str, doc: str, current: str, values: tuple[str, ...]) -> None:
        """A state as one gauge series per possible value, 1 for the current one."""
        self.lines.append(_header(name, "gauge", doc))
        self.lines.append(_one_hot_lines(name, current, values))

    def render(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


# ---- the process's own metrics -----------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _boot_time() -> float:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    return 0.0


def process_start() -> float:
    """This process's start, in seconds since the epoch (`process_start_time_seconds`)."""
    ticks = start_time(os.getpid())  # seconds after boot, as the kernel counts them
    return _boot_time() + ticks if ticks is not None else time.time()


class _Statm:
    """/proc/self/statm, read with one `pread` on a descriptor kept open (the kernel makes the
    text anew on every read from offset 0): an open, read and close cost more than the rest of
    the process metrics together."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def __call__(self) -> list[bytes]:
        if self.fd is None:
            self.fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        return os.pread(self.fd, 256, 0).split()


class _ProcessFamilies:
    """The `process_*` families, read at most once per PROCESS_EVERY: they move slowly, a
    scrape comes every few seconds, and reading them (four system calls and a listing of
    /proc/self/fd) was the dearest part of a scrape that comes more often."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.at = -PROCESS_EVERY
        self._statm = _Statm()

    def __call__(self, started: float) -> list[str]:
        now = time.monotonic()
        if now - self.at >= PROCESS_EVERY:
            self.lines, self.at = self._read(started), now
        return self.lines

    def _read(self, started: float) -> list[str]:
        out = Exposition()
        cpu = os.times()
        out.one(
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time",
            cpu.user + cpu.system,
        )
        size, resident = self._statm()[:2]
        out.one("process_virtual_memory_bytes", "gauge", "Virtual memory size", int(size) * _PAGE)
        out.one("process_resident_memory_bytes", "gauge", "Resident memory", int(resident) * _PAGE)
        out.one("process_start_time_seconds", "gauge", "Start time since the epoch", started)
        fds = len(os.listdir("/proc/self/fd"))
        out.one("process_open_fds", "gauge", "Open file descriptors", fds)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        out.one("process_max_fds", "gauge", "Limit on open file descriptors", soft)
        return out.lines


_process_families = _ProcessFamilies()


def process_metrics(out: Exposition, started: float) -> None:
    """What prometheus-client's process collector gives (`os.times`, /proc/self/statm, a
    listing of /proc/self/fd, the fd limit), as read at most PROCESS_EVERY ago."""
    out.lines.extend(_process_families(started))
