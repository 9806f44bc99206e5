"""Getting the engine ready, off the UI thread: load, GPU probe, persona prefix.

Contract:
- `EngineSetup`'s methods run in threads the app starts; they never touch
  widgets and report only by posting the messages nested in `EngineSetup` to
  its target (posting is thread-safe): `LoadProgressed`, `Loaded`,
  `LoadFailed`, `PersonaPreparing`, `PersonaProgressed`, `PersonaPrepared`,
  `GpuPolled`.
- Preparing a persona first looks at the engine's cache (a folder scan, hence
  here and not on the UI thread) and says how the prefix will be made ready
  (`PersonaPreparing`: restored from RAM or disk, or prefilled on first use).
- A loaded engine is handed to the app's `EngineLease`; if the app quit while
  the model loaded, the lease closes it. Errors become messages with a
  printable reason, never tracebacks (ui/worker_errors.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from textual.message import Message
from textual.message_pump import MessagePump

from chatterm.core.config.personas import Persona
from chatterm.core.engine.interface import DeviceInfo, Engine, PrefillProgress, PrefixReport
from chatterm.ui.engine_lease import EngineClosing, EngineLease
from chatterm.ui.worker_errors import reported

if TYPE_CHECKING:
    from chatterm.core.config.catalog import ModelSpec
    from chatterm.core.engine.conversation import EnergyMeter
    from chatterm.core.system.gpu import GpuStatus

log = logging.getLogger(__name__)

EngineFactory = Callable[["ModelSpec"], Engine]
GpuProbe = Callable[[], "GpuStatus | None"]
MeterFactory = Callable[[], "EnergyMeter | None"]


def default_gpu_status() -> "GpuStatus | None":
    from chatterm.core.system.gpu import gpu_status

    return gpu_status()


def energy_meter_factory(usd_per_kwh: float) -> MeterFactory:
    def make() -> "EnergyMeter | None":
        from chatterm.core.system.gpu import energy_meter_or_none, resolve_usd_per_kwh

        return energy_meter_or_none(resolve_usd_per_kwh(usd_per_kwh))

    return make


class EngineSetup:
    @dataclass
    class LoadProgressed(Message):
        fraction: float

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, EngineSetup.LoadProgressed)

    @dataclass
    class Loaded(Message):
        engine: Engine
        device: DeviceInfo
        gpu: "GpuStatus | None"
        energy: "EnergyMeter | None"

    @dataclass
    class LoadFailed(Message):
        error: str

    @dataclass
    class PersonaPreparing(Message):
        """How `persona`'s prefix is about to be made ready."""

        persona: Persona
        cacheable: bool
        """The engine keeps persona prefixes (False: a server, nothing to wait for)."""
        tier: str | None
        """Where its state is cached ("ram" or "disk"); None: a first use prefills it."""

    @dataclass
    class PersonaProgressed(Message):
        """A long persona prefill's progress (posted from the prepare worker)."""

        persona: Persona
        progress: PrefillProgress

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, EngineSetup.PersonaProgressed)

    @dataclass
    class PersonaPrepared(Message):
        persona: Persona
        report: PrefixReport | None
        error: str | None = None

    @dataclass
    class GpuPolled(Message):
        status: "GpuStatus | None"

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, EngineSetup.GpuPolled)

    def __init__(self, target: MessagePump, lease: EngineLease, engine_factory: EngineFactory,
                 gpu_probe: GpuProbe, meter_factory: MeterFactory) -> None:
        self.target = target
        self.lease = lease
        self.engine_factory = engine_factory
        self.gpu_probe = gpu_probe
        self.meter_factory = meter_factory
        self.model_loaded = threading.Event()
        """Set once llama.cpp's load has returned: from then on quitting must let
        the engine close normally (its queued state saves reach the disk)."""

    def load(self, spec: "ModelSpec", persona: Persona) -> None:
        """Load the model, probe the GPU, then prepare `persona` (a thread)."""
        post = self.target.post_message
        with reported(self.target, self.LoadFailed, "model load"):
            engine = self._load_engine(spec)
            if not self.lease.adopt(engine):
                return  # the app quit while the model loaded
            with self.lease.use():
                device = engine.device()
                # The GPU probe may import torch (seconds): here, off the UI thread.
                gpu = self.probe_gpu()
                energy = self._make_energy_meter() if gpu is not None else None
                post(self.Loaded(engine, device, gpu, energy))
                self._prepare(engine, persona)

    def prepare(self, persona: Persona) -> None:
        """Make `persona`'s prefix ready on the loaded engine (a thread worker)."""
        with contextlib.suppress(EngineClosing), self.lease.use() as engine:
            self._prepare(engine, persona)

    def poll_gpu(self) -> None:
        """Read the GPU's memory and power (a thread worker)."""
        self.target.post_message(self.GpuPolled(self.probe_gpu()))

    def probe_gpu(self) -> "GpuStatus | None":
        try:
            return self.gpu_probe()
        except Exception:  # noqa: BLE001 - no telemetry is "n/a", not an error
            log.debug("GPU probe failed", exc_info=True)
            return None

    def _load_engine(self, spec: "ModelSpec") -> Engine:
        engine = self.engine_factory(spec)
        try:
            engine.load(self._progress)
        except Exception:
            _close_quietly(engine)
            raise
        self.model_loaded.set()
        return engine

    def _progress(self, fraction: float) -> bool:
        """Report load progress; False (app quitting) makes the engine abandon the load."""
        self.target.post_message(self.LoadProgressed(fraction))
        return not self.lease.closing

    def _make_energy_meter(self) -> "EnergyMeter | None":
        try:
            return self.meter_factory()
        except Exception:  # noqa: BLE001 - no meter means energy shows "n/a"
            log.debug("no energy meter", exc_info=True)
            return None

    def _prepare(self, engine: Engine, persona: Persona) -> None:
        post = self.target.post_message
        with reported(self.target, lambda error: self.PersonaPrepared(persona, None, error), "persona prepare"):
            cacheable = engine.capabilities.persona_cache
            post(self.PersonaPreparing(persona, cacheable, _cache_tier(engine, persona) if cacheable else None))
            report = engine.prepare_persona(persona, lambda progress: post(self.PersonaProgressed(persona, progress)))
            post(self.PersonaPrepared(persona, report))


def _cache_tier(engine: Engine, persona: Persona) -> str | None:
    try:
        return engine.cached_personas().get(persona.id)
    except Exception:  # noqa: BLE001 - an unreadable cache only changes the status's wording
        log.debug("reading the persona cache failed", exc_info=True)
        return None


def _close_quietly(engine: Engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - the load error is the one to show
        log.debug("closing a half-loaded engine failed", exc_info=True)
