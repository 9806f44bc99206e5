"""The machine chatterm runs on: what a benchmark figure needs said about it,
and how busy other processes keep it (for the engine's prefill threads).

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
- `usable_cpus()`: the CPU numbers this process may run on (its affinity
  mask; every CPU of the machine where there is no mask).
- `physical_cores(cpus, sys_cpu)`: how many physical cores those CPUs sit on,
  from the OS's sibling lists (`topology/core_cpus_list`, else the older
  `thread_siblings_list`): hardware threads of one core count once. A CPU
  without a readable list counts as a core of its own, so a machine without
  /sys gets one thread per CPU, never a guess that halves it.
- `OtherLoad`: how many of this process's CPUs other processes keep busy at
  normal priority, sampled by a daemon thread (what llama.cpp's threads will
  compete with; see `chatterm.core.engine.local.model.Threads`).
"""

from __future__ import annotations

import os
import platform
import threading
import time
import timeit
from pathlib import Path
from typing import Iterable

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


SYS_CPU = Path("/sys/devices/system/cpu")
SIBLING_LISTS = ("core_cpus_list", "thread_siblings_list")
"""Per-CPU files under `topology/` naming the CPUs of the same core, newest name first."""


def usable_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def physical_cores(cpus: Iterable[int] | None = None, sys_cpu: Path = SYS_CPU) -> int:
    cpus = usable_cpus() if cpus is None else frozenset(cpus)
    cores = {_siblings(cpu, sys_cpu) for cpu in cpus}
    return max(len(cores), 1)


def _siblings(cpu: int, sys_cpu: Path) -> frozenset[int]:
    """The CPUs sharing `cpu`'s core (just `cpu` where the OS does not say)."""
    for name in SIBLING_LISTS:
        try:
            text = (sys_cpu / f"cpu{cpu}" / "topology" / name).read_text(encoding="ascii")
        except (OSError, ValueError):
            continue
        found = _parse_cpu_list(text)
        if cpu in found:
            return found
    return frozenset({cpu})


def _parse_cpu_list(text: str) -> frozenset[int]:
    """A kernel CPU list ("0-3,8,10-11"); empty when it does not parse."""
    cpus: set[int] = set()
    try:
        for part in text.strip().split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    except ValueError:
        return frozenset()
    return frozenset(cpus)


def _cpu_jiffies(cpus: frozenset[str] = frozenset({"cpu"})) -> tuple[int, int, int] | None:
    """(busy, nice, idle) jiffies since boot, summed over the /proc/stat lines
    named in `cpus` ("cpu" is all CPUs together, "cpu0"... one each). busy is
    user, system, irq, softirq and steal (guest time is inside user); nice is
    apart, as work that yields to normal-priority work; idle includes iowait."""
    busy = nice = idle = 0
    found = False
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(" ")
                if name in cpus:
                    v = [int(x) for x in rest.split()[:8]]
                    if len(v) < 5:
                        return None
                    busy += v[0] + v[2] + sum(v[5:8])
                    nice += v[1]
                    idle += v[3] + v[4]
                    found = True
    except (OSError, ValueError):
        return None
    return (busy, nice, idle) if found else None


def busy_fraction(seconds: float = 0.5) -> float | None:
    before = _cpu_jiffies()
    time.sleep(seconds)
    after = _cpu_jiffies()
    if before is None or after is None:
        return None
    idle = after[2] - before[2]
    total = sum(after) - sum(before)
    if total <= 0:
        return None
    return min(max(1.0 - idle / total, 0.0), 1.0)


class OtherLoad:
    """CPU cores (of this process's CPU set) that other processes kept busy,
    from /proc/stat minus this process's own CPU time. Work at a lower
    priority (nice) does not count: it yields to ours. A daemon thread
    measures a window every `interval_s` (a failed read skips one);
    `cores` is the larger of the last two windows, so one quiet half second
    inside a steady load does not count as idle. Before the first window ends,
    `cores` measures from `start()` to now (at least `FIRST_WINDOW_S`): a
    command that prefills right after loading its model still sees the load.
    None where /proc/stat cannot be read, and after `stop()`."""

    FIRST_WINDOW_S = 0.1

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        try:
            self._cpus: frozenset[str] | None = frozenset(f"cpu{n}" for n in os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cpus = None
        try:
            # A niced chatterm's own time is in the nice column: keep it there to subtract it.
            self._count_nice = os.getpriority(os.PRIO_PROCESS, 0) > 0
        except (AttributeError, OSError):
            self._count_nice = False
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
        if self._stop.is_set():
            return None
        windows = self._windows
        if windows:
            return max(windows)
        if self._first is None:
            return None
        now = self._sample()
        if now is None or now[0] - self._first[0] < self.FIRST_WINDOW_S:
            return None
        return self._busy(self._first, now)

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall s, busy CPU s of our CPUs, own CPU s)."""
        jiffies = _cpu_jiffies(self._cpus) if self._cpus is not None else None
        if jiffies is None:
            return None
        busy, nice, _idle = jiffies
        own = os.times()
        return time.monotonic(), (busy + (nice if self._count_nice else 0)) / self._tick, own.user + own.system

    @staticmethod
    def _busy(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
        wall = after[0] - before[0]
        return max((after[1] - before[1]) - (after[2] - before[2]), 0.0) / wall if wall > 0 else 0.0

    def _run(self) -> None:
        last = self._first
        while not self._stop.wait(self.interval_s):
            now = self._sample()
            if now is None or last is None:
                last = now  # one failed read: the next window starts from the next good sample
                continue
            self._windows = (*self._windows[-1:], self._busy(last, now))
            last = now
