"""Where a run's time and memory go: wall seconds and peak resident memory per stage.

`StageClock.stage(name)` brackets one stretch of work (model load, warm-up, an evaluation,
rollouts, an update, a weight sync...). Each name accumulates its calls and seconds, and keeps
the highest resident set size (RSS) the process reached while a stage of that name was open.

Peaks are exact on Linux: entering a stage resets the kernel's high-water mark
(`/proc/self/clear_refs`), and leaving reads it (`VmHWM`). Stages may nest or overlap (pipelined
rollouts run during updates, in another thread); a peak then counts for every stage open at the
time; the whole run's peak is the highest mark seen at any reset or read, inside a stage or
not. Resetting the mark is process-wide: run one `StageClock` per process. Elsewhere the peak
is the process's lifetime maximum (`getrusage`), an upper bound. Only this process is measured:
sandboxed environment workers and a vLLM server are not.
"""

from __future__ import annotations

import json
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class StageRecord:
    """The totals of one stage name."""

    calls: int = 0
    seconds: float = 0.0
    peak_bytes: int = 0


class StageClock:
    """Accumulates wall time and peak RSS per stage name, in first-entered order."""

    def __init__(self) -> None:
        self.records: dict[str, StageRecord] = {}
        self.started = time.perf_counter()
        self._open: dict[int, int] = {}  # id of an open stage -> the peak seen while open
        self._run_peak = 0  # the highest mark seen so far, in a stage or not
        self._lock = threading.Lock()
        self._exact = _resettable()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body as one call of stage `name` and record the peak RSS during it."""
        token = object()
        with self._lock:
            self._fold_and_reset()
            self._open[id(token)] = 0
            self.records.setdefault(name, StageRecord())
        started = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - started
            with self._lock:
                self._fold_and_reset()
                peak = self._open.pop(id(token))
                record = self.records[name]
                record.calls += 1
                record.seconds += seconds
                record.peak_bytes = max(record.peak_bytes, peak)

    def peak_bytes(self) -> int:
        """The highest RSS since the clock was created (exact on Linux)."""
        with self._lock:
            self._run_peak = max(self._run_peak, high_water_bytes())
            return self._run_peak

    def total_seconds(self) -> float:
        """Wall seconds since the clock was created."""
        return time.perf_counter() - self.started

    def to_dict(self) -> dict:
        """Stages, total wall seconds and peak RSS, JSON-ready."""
        return {
            "total_seconds": self.total_seconds(),
            "peak_rss_bytes": self.peak_bytes(),
            "peak_exact": self._exact,
            "stages": {name: asdict(record) for name, record in self.records.items()},
        }

    def save(self, path: str | Path) -> Path:
        """Write `to_dict()` as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2))
        return path

    def table(self) -> str:
        """A plain-text table: stage, calls, seconds (and share of the total), peak RSS."""
        total = self.total_seconds()
        lines = [f"{'stage':<16} {'calls':>5} {'seconds':>9} {'share':>6} {'peak RSS':>9}"]
        for name, record in self.records.items():
            lines.append(
                f"{name:<16} {record.calls:>5} {record.seconds:>9.1f} "
                f"{record.seconds / max(total, 1e-9):>6.1%} {_gb(record.peak_bytes):>9}"
            )
        lines.append(f"{'whole run':<16} {'':>5} {total:>9.1f} {'':>6} {_gb(self.peak_bytes()):>9}")
        if not self._exact:
            lines.append("(peaks are the process's lifetime maximum: no /proc/self/clear_refs)")
        return "\n".join(lines)

    def _fold_and_reset(self) -> None:
        """Credit the high-water mark so far to every open stage, then restart it."""
        mark = high_water_bytes()
        self._run_peak = max(self._run_peak, mark)
        for key, peak in self._open.items():
            self._open[key] = max(peak, mark)
        if self._exact:
            _reset_high_water()


def _gb(count: int) -> str:
    return f"{count / 1e9:.2f} GB"


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int:
    """This process's resident set size now (0 where it cannot be read)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


def high_water_bytes() -> int:
    """The highest RSS since the last reset (Linux), else the process's lifetime maximum."""
    kib = _status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def _reset_high_water() -> None:
    _CLEAR_REFS.write_text("5")


def _resettable() -> bool:
    try:
        _reset_high_water()
    except OSError:
        return False
    return _status_kib("VmHWM") is not None


class StepBudget:
    """A time budget for training steps (`max_seconds`), measured from the first step of a
    `train()` call: a step is not started if, at the mean step time so far, it would end past
    the budget."""

    def __init__(self, max_seconds: float | None, first_step: int) -> None:
        self.max_seconds, self.first_step = max_seconds, first_step
        self.started = time.perf_counter()

    def over(self, step: int, current: int, gather: Callable[[list[Any]], list[Any]]) -> str:
        """Why step `step` would end past the budget, `current` steps done in all ("" if it
        would not, or there is no budget); `gather` shares the clocks of all processes (the
        slowest decides)."""
        done = current - self.first_step
        if self.max_seconds is None or done == 0:
            return ""
        elapsed = max(gather([time.perf_counter() - self.started]))
        if elapsed + elapsed / done * (step - current + 1) > self.max_seconds:
            return f"max_seconds ({self.max_seconds:.0f} s): {done} steps in {elapsed:.0f} s"
        return ""
