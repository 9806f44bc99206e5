"""GPU telemetry (chatterm.core.system.gpu) without a GPU: the lazy torch
import, the "n/a" path, the torch.cuda unit conversions (through a stand-in
`torch` module, since torch is an optional extra), the energy integral and the
sampling thread's lifecycle."""

from __future__ import annotations

import subprocess
import sys
import threading
import types

import pytest

from chatterm.core.metrics.cost import energy_cost_usd
from chatterm.core.system.gpu import (
    USD_PER_KWH_ENV,
    GpuEnergyMeter,
    GpuStatus,
    energy_meter_or_none,
    gpu_status,
    integrate_wh,
    resolve_usd_per_kwh,
)
from chatterm.errors import ChattermError

MIB = 1024 * 1024


def test_importing_the_module_does_not_import_torch():
    # A fresh interpreter: this test process may have torch loaded by others.
    code = (
        "import sys, chatterm.core.system.gpu, chatterm.core.engine.local.offload; "
        "print('torch' in sys.modules, 'llama_cpp' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@pytest.fixture
def no_torch(monkeypatch):
    # A None entry makes `import torch` raise ImportError, as when it is not installed.
    monkeypatch.setitem(sys.modules, "torch", None)


def fake_torch(monkeypatch, available=True, power_mw=None, power_error=None):
    def power_draw(device=None):
        if power_error is not None:
            raise power_error
        return power_mw

    cuda = types.SimpleNamespace(
        is_available=lambda: available,
        get_device_name=lambda device=None: "NVIDIA H200",
        mem_get_info=lambda device=None: (40_000 * MIB, 143_771 * MIB),
        power_draw=power_draw,
    )
    module = types.ModuleType("torch")
    module.cuda = cuda
    monkeypatch.setitem(sys.modules, "torch", module)


def test_without_torch_status_and_meter_are_not_available(no_torch):
    assert gpu_status() is None
    assert energy_meter_or_none(0.2) is None
    # The meter itself still works and reports "no readings" instead of failing.
    meter = GpuEnergyMeter(0.2, interval_s=0.01)
    assert meter.stop(meter.start()) is None


def test_torch_without_a_cuda_device_is_not_available(monkeypatch):
    fake_torch(monkeypatch, available=False, power_mw=100_000)
    assert gpu_status() is None
    assert energy_meter_or_none(0.2) is None


def test_status_converts_torch_cuda_readings(monkeypatch):
    fake_torch(monkeypatch, power_mw=123_456)
    assert gpu_status() == GpuStatus(
        name="NVIDIA H200",
        memory_used_mb=103_771.0,
        memory_total_mb=143_771.0,
        power_w=123.456,
    )
    meter = energy_meter_or_none(0.25)
    assert isinstance(meter, GpuEnergyMeter)
    assert meter.usd_per_kwh == 0.25


def test_no_power_reading_means_no_energy_meter(monkeypatch):
    # torch.cuda.power_draw raises when pynvml (nvidia-ml-py) is missing.
    fake_torch(monkeypatch, power_error=ModuleNotFoundError("No module named 'pynvml'"))
    status = gpu_status()
    assert status is not None and status.power_w is None
    assert status.name == "NVIDIA H200"
    assert energy_meter_or_none(0.2) is None


# -- energy arithmetic -----------------------------------------------------------


def test_trapezoid_integral_in_watt_hours():
    assert integrate_wh([]) is None
    assert integrate_wh([(5.0, 300.0)]) == 0.0
    assert integrate_wh([(0.0, 100.0), (36.0, 100.0)]) == pytest.approx(1.0)  # 3,600 J
    # A ramp from 0 to 200 W over 1.8 s: 180 J; order of samples does not matter.
    assert integrate_wh([(1.8, 200.0), (0.0, 0.0)]) == pytest.approx(0.05)
    samples = [(0.0, 100.0), (1.0, 300.0), (3.0, 100.0)]  # 200 J + 400 J
    assert integrate_wh(samples) == pytest.approx(600.0 / 3600.0)


class StepClock:
    """A clock the test moves; the meter's thread sees the same value."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_meter_integrates_power_from_start_to_stop():
    clock = StepClock()
    # Power follows the clock: 100 W at t=0, 200 W at t=72 s. Whatever number of
    # samples the thread reads in between, each lands on t=0 or t=72.
    meter = GpuEnergyMeter(
        0.30, interval_s=0.005, read_power_w=lambda: 100.0 if clock.now < 1 else 200.0, clock=clock
    )
    handle = meter.start()
    clock.now = 72.0
    wh = meter.stop(handle)
    assert wh == pytest.approx(150.0 * 72.0 / 3600.0)  # 3.0 Wh
    assert meter.stop(handle) == wh  # stopping twice is harmless
    # What Conversation records for the turn with this meter's price.
    assert energy_cost_usd(wh, meter.usd_per_kwh) == pytest.approx(0.0009)


def test_meter_thread_samples_in_the_background_and_stops():
    sampled = threading.Event()
    calls = []

    def reader():
        calls.append(1)
        if len(calls) >= 4:  # start() reads once; three more come from the thread
            sampled.set()
        return 50.0

    meter = GpuEnergyMeter(0.2, interval_s=0.005, read_power_w=reader)
    handle = meter.start()
    assert handle.thread.daemon and handle.thread.name == "chatterm-gpu-energy"
    assert sampled.wait(10), "the sampling thread never read the power"
    assert meter.stop(handle) > 0
    assert not handle.thread.is_alive()
    assert len(handle.samples) >= 5  # start, three thread samples, stop
    # The thread has exited (joined above), so the reader is never called again.
    calls_at_stop = len(calls)
    assert meter.stop(handle) is not None
    assert len(calls) == calls_at_stop


def test_overlapping_runs_have_their_own_threads():
    meter = GpuEnergyMeter(0.2, interval_s=0.005, read_power_w=lambda: 10.0)
    a, b = meter.start(), meter.start()
    assert a.thread is not b.thread
    meter.stop(a)
    assert not a.thread.is_alive() and b.thread.is_alive()
    meter.stop(b)
    assert not b.thread.is_alive()


@pytest.mark.parametrize("reading", ["none", "raises", "nan"])
def test_meter_without_readings_returns_none(reading):
    def reader():
        if reading == "raises":
            raise RuntimeError("NVML: insufficient permissions")
        return None if reading == "none" else float("nan")

    meter = GpuEnergyMeter(0.2, interval_s=0.005, read_power_w=reader)
    handle = meter.start()
    assert meter.stop(handle) is None
    assert not handle.thread.is_alive()


def test_stop_with_a_foreign_handle_returns_none():
    meter = GpuEnergyMeter(0.2, read_power_w=lambda: 10.0)
    assert meter.stop(object()) is None


# -- electricity price -------------------------------------------------------------


def test_price_comes_from_env_then_catalog(monkeypatch):
    monkeypatch.delenv(USD_PER_KWH_ENV, raising=False)
    assert resolve_usd_per_kwh(0.31) == 0.31
    monkeypatch.setenv(USD_PER_KWH_ENV, "0.42")
    assert resolve_usd_per_kwh(0.31) == 0.42


@pytest.mark.parametrize("raw", ["cheap", "-0.1", "nan", "inf"])
def test_a_bad_price_in_the_environment_is_one_clear_error(monkeypatch, raw):
    monkeypatch.setenv(USD_PER_KWH_ENV, raw)
    with pytest.raises(ChattermError) as err:
        resolve_usd_per_kwh(0.2)
    assert USD_PER_KWH_ENV in str(err.value) and repr(raw) in str(err.value)


def test_default_price_is_the_catalogs(monkeypatch, tmp_path):
    from chatterm.core.config import resources
    from chatterm.core.config.catalog import CatalogDefaults, load_catalog
    from chatterm.core.config.schema import defaults

    monkeypatch.delenv(USD_PER_KWH_ENV, raising=False)
    bare = tmp_path / "models.toml"  # no [defaults] usd_per_kwh: the one default applies
    bare.write_text(resources.bundled_models_file().read_text().replace("usd_per_kwh", "# usd_per_kwh"))
    assert load_catalog(bare).usd_per_kwh == defaults(CatalogDefaults)["usd_per_kwh"]
    catalog = load_catalog(resources.bundled_models_file())
    assert resolve_usd_per_kwh(catalog.usd_per_kwh) == catalog.usd_per_kwh
