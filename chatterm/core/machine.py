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
- `OtherLoad`: how many of this process's CPUs other processes keep busy,
  sampled by a daemon thread (what llama.cpp's prefill threads will compete
  with; see `chatterm.core.llama_model.BatchThreads`).
"""

from __future__ import annotations

import os
import platform
import threading
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


class OtherLoad:
    """CPU cores (of this process's CPU set) that other processes kept busy,
    from /proc/stat minus this process's own CPU time. A daemon thread measures
    a window every `interval_s`; `cores` is the larger of the last two windows,
    so one quiet half second inside a steady load does not count as idle.
    Before the first window ends, `cores` measures from `start()` to now (at
    least `FIRST_WINDOW_S`): a command that prefills right after loading its
    model still sees the load. None where /proc/stat cannot be read."""

    FIRST_WINDOW_S = 0.1

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        try:
            self._cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        except (AttributeError, OSError):
            self._cpus = None
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._first: tuple[float, float, float] | None = None
        self._windows: tuple[float, ...] = ()
        self._stop = threading.Event()

    def start(self) -> "OtherLoad":
        self._first = self._sample() if self._cpus is not None else None
        if self._first is not None:
            threading.Thread(target=self._run, name="chatterm-other-load", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def cores(self) -> float | None:
        if self._windows:
            return max(self._windows)
        if self._first is None or self._stop.is_set():
            return None
        now = self._sample()
        if now is None or now[0] - self._first[0] < self.FIRST_WINDOW_S:
            return None
        return self._busy(self._first, now)

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall s, busy CPU s of our CPUs, own CPU s)."""
        busy = 0
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                for line in fh:
                    name, _, rest = line.partition(" ")
                    if name in self._cpus:
                        values = [int(v) for v in rest.split()[:8]]
                        busy += sum(values) - values[3] - values[4]  # all but idle and iowait
        except (OSError, ValueError, IndexError):
            return None
        own = os.times()
        return time.monotonic(), busy / self._tick, own.user + own.system

    @staticmethod
    def _busy(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
        wall = after[0] - before[0]
        return max((after[1] - before[1]) - (after[2] - before[2]), 0.0) / wall if wall > 0 else 0.0

    def _run(self) -> None:
        last = self._first
        while last is not None and not self._stop.wait(self.interval_s):
            now = self._sample()
            if now is not None:
                self._windows = (*self._windows[-1:], self._busy(last, now))
            last = now
        self._windows = ()
