"""What a benchmark figure needs said about the machine it was measured on.

Contract:
- `cpu_name()`: the CPU model (Linux /proc/cpuinfo; elsewhere what `platform`
  knows), never empty.
- `calibration_ms()`: best of five `sum(range(10**6))` in milliseconds, the
  quick calibration printed beside every figure (README), so a figure from one
  machine can be scaled to another.
- `busy_fraction(seconds)`: the share of all CPU time that other processes used
  over `seconds` while this one sleeps (0.0 idle, 1.0 every core busy); None
  where /proc/stat cannot be read. Ratios measured within one run survive a
  steady load, not a load that comes and goes, so benchmarks warn above
  `BUSY_WARNING`.
"""

from __future__ import annotations

import platform
import time
import timeit

BUSY_WARNING = 0.25
"""Share of the CPU in use by others above which a benchmark says its figures may not hold."""


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def calibration_ms() -> float:
    return min(timeit.repeat("sum(range(10**6))", number=1, repeat=5)) * 1000.0


def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies over all CPUs since boot."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(values) < 5:
        return None
    return values[3] + values[4], sum(values[:8])  # idle + iowait; guest time is inside user


def busy_fraction(seconds: float = 0.5) -> float | None:
    before = _cpu_times()
    time.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return None
    idle, total = after[0] - before[0], after[1] - before[1]
    return min(max(1.0 - idle / total, 0.0), 1.0)
