"""GPU telemetry through torch.cuda: device name, memory, power, energy per turn.

Contract:
- torch is optional (the `gpu` extra) and imported only inside these functions,
  never when this module is imported: `chatterm launch` pays nothing for it
  when it is not needed. The first call that imports torch takes seconds, so the
  UI calls `gpu_status()` / `energy_meter_or_none()` from a worker thread.
- `gpu_status()` returns None without torch, without a CUDA device, or when the
  driver cannot be queried; the dashboard then shows "n/a". Power is None when
  NVML cannot be read (torch.cuda.power_draw needs the `pynvml` module, shipped
  by nvidia-ml-py).
- Memory is device-wide (cudaMemGetInfo: total - free), so it includes
  llama.cpp's own allocations, which torch's allocator statistics would not.
  Querying it creates a CUDA context in this process (a few hundred MB of VRAM,
  once).
- `GpuEnergyMeter` implements `conversation.EnergyMeter`: `start()` samples
  power in a daemon thread every `interval_s`; `stop(handle)` ends that thread
  and returns the trapezoid integral in Wh, or None when no sample was read.
  NVML's reading is itself an average over 1/6..1 s (per torch's docs; 1 s on
  Ampere and newer), so energies of turns shorter than a second are estimates.
- The electricity price: `CHATTERM_USD_PER_KWH` overrides models.toml's
  `[defaults] usd_per_kwh` (`ModelCatalog.usd_per_kwh`); see `resolve_usd_per_kwh`.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from chatterm.errors import ChattermError

log = logging.getLogger(__name__)

USD_PER_KWH_ENV = "CHATTERM_USD_PER_KWH"

PowerReader = Callable[[], "float | None"]
"""Returns the current power draw in watts, or None when it cannot be read."""


@dataclass(frozen=True)
class GpuStatus:
    """One reading of the GPU, for the dashboard's device panel."""

    name: str
    memory_used_mb: float
    """Device-wide: every process and every allocator (MiB)."""
    memory_total_mb: float
    power_w: float | None
    """Board power in watts; None when NVML cannot be read."""


def _cuda():
    """torch.cuda when torch is installed and sees a CUDA device, else None."""
    try:
        import torch
    except Exception:  # noqa: BLE001 - a broken torch install is "no torch" here
        return None
    try:
        if not torch.cuda.is_available():
            return None
    except Exception:  # noqa: BLE001 - driver trouble is "no GPU" for the dashboard
        return None
    return torch.cuda


def _read_power_w(cuda, device: int | None) -> float | None:
    try:
        # torch.cuda.power_draw: average board power over the last NVML sample
        # period, in milliwatts.
        return float(cuda.power_draw(device)) / 1000.0
    except Exception as exc:  # noqa: BLE001 - no pynvml, no permission, unsupported board
        log.debug("no GPU power reading: %s", exc)
        return None


def gpu_status(device: int | None = None) -> GpuStatus | None:
    """Name, memory and power of `device` (default: the current one), or None."""
    cuda = _cuda()
    if cuda is None:
        return None
    try:
        name = cuda.get_device_name(device)
        free_b, total_b = cuda.mem_get_info(device)
    except Exception as exc:  # noqa: BLE001
        log.debug("cannot query the GPU: %s", exc)
        return None
    mib = 1024.0 * 1024.0
    return GpuStatus(
        name=str(name),
        memory_used_mb=(total_b - free_b) / mib,
        memory_total_mb=total_b / mib,
        power_w=_read_power_w(cuda, device),
    )


def torch_power_reader(device: int | None = None) -> PowerReader | None:
    """A power reader for `device`, or None without torch/CUDA."""
    cuda = _cuda()
    if cuda is None:
        return None
    return lambda: _read_power_w(cuda, device)


def integrate_wh(samples: Sequence[tuple[float, float]]) -> float | None:
    """Energy in Wh of (time s, power W) samples by the trapezoid rule.

    None without samples; a single sample has no duration, so 0.0.
    """
    if not samples:
        return None
    points = sorted(samples)
    joules = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(points):
        joules += (p0 + p1) / 2.0 * (t1 - t0)
    return joules / 3600.0


@dataclass
class _Sampling:
    """One meter run: its thread and the samples it has read."""

    stop_event: threading.Event = field(default_factory=threading.Event)
    samples: list[tuple[float, float]] = field(default_factory=list)
    thread: threading.Thread | None = None
    energy_wh: float | None = None
    stopped: bool = False


class GpuEnergyMeter:
    """GPU energy per turn (see the module contract). One meter serves many turns;
    each `start()` returns its own handle, so runs may overlap."""

    def __init__(
        self,
        usd_per_kwh: float,
        interval_s: float = 0.1,
        read_power_w: PowerReader | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.usd_per_kwh = usd_per_kwh
        self.interval_s = interval_s
        # Injected readers let tests (and other backends) feed known samples.
        self._read = read_power_w if read_power_w is not None else torch_power_reader()
        self._clock = clock

    def _sample(self, run: _Sampling) -> None:
        if self._read is None:
            return
        try:
            watts = self._read()
        except Exception as exc:  # noqa: BLE001 - a failed reading is a missing sample
            log.debug("power reading failed: %s", exc)
            return
        if watts is not None and math.isfinite(watts):
            run.samples.append((self._clock(), float(watts)))

    def _loop(self, run: _Sampling) -> None:
        while not run.stop_event.wait(self.interval_s):
            self._sample(run)

    def start(self) -> _Sampling:
        run = _Sampling()
        self._sample(run)
        run.thread = threading.Thread(
            target=self._loop, args=(run,), name="chatterm-gpu-energy", daemon=True
        )
        run.thread.start()
        return run

    def stop(self, handle: object) -> float | None:
        """Energy in Wh since `start`, or None when no power was read.
        Stopping twice returns the first result."""
        if not isinstance(handle, _Sampling):
            return None
        if handle.stopped:
            return handle.energy_wh
        handle.stop_event.set()
        if handle.thread is not None:
            handle.thread.join()
        self._sample(handle)
        handle.stopped = True
        handle.energy_wh = integrate_wh(handle.samples)
        return handle.energy_wh


def energy_meter_or_none(
    usd_per_kwh: float, interval_s: float = 0.1, device: int | None = None
) -> GpuEnergyMeter | None:
    """A meter when a GPU reports power, else None (energy fields show "n/a")."""
    status = gpu_status(device)
    if status is None or status.power_w is None:
        return None
    return GpuEnergyMeter(usd_per_kwh, interval_s, read_power_w=torch_power_reader(device))


def resolve_usd_per_kwh(configured: float) -> float:
    """The electricity price: $CHATTERM_USD_PER_KWH, else `configured` (the
    catalog's `[defaults] usd_per_kwh`, which has the default)."""
    raw = os.environ.get(USD_PER_KWH_ENV)
    if raw is None or not raw.strip():
        return configured
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise ChattermError(
            f"{USD_PER_KWH_ENV}={raw!r} must be a non-negative number (US dollars per kWh)"
        )
    return value
