"""Getting the engine ready, off the UI thread: load, GPU probe, persona prefix.

Contract:
- `EngineSetup`'s methods run in thread workers the app starts; they never
  touch widgets and report only by posting the messages defined here to the
  app (posting is thread-safe): `LoadProgressed`, `EngineLoaded`, `LoadFailed`,
  `PersonaPrepared`, `GpuPolled`.
- A loaded engine is handed to the app's `EngineLease`; if the app quit while
  the model loaded, the lease closes it. Errors become messages with a
  printable reason, never tracebacks (unexpected ones are logged).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from textual.message import Message
from textual.message_pump import MessagePump

from chatterm.core.config.personas import Persona
from chatterm.core.engine.interface import DeviceInfo, Engine, PrefillProgress, PrefixReport
from chatterm.errors import ChattermError, describe
from chatterm.ui.engine_lease import EngineClosing, EngineLease

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


@dataclass
class LoadProgressed(Message):
    fraction: float

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgressed)


@dataclass
class EngineLoaded(Message):
    engine: Engine
    device: DeviceInfo
    gpu: "GpuStatus | None"
    energy: "EnergyMeter | None"


@dataclass
class LoadFailed(Message):
    error: str


@dataclass
class PersonaPrepared(Message):
    persona: Persona
    report: PrefixReport | None
    error: str | None = None


@dataclass
class PersonaProgressed(Message):
    """A long persona prefill's progress (posted from the prepare worker)."""

    persona: Persona
    progress: PrefillProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, PersonaProgressed)


@dataclass
class GpuPolled(Message):
    status: "GpuStatus | None"

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpuPolled)


class EngineSetup:
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
        engine: Engine | None = None
        try:
            engine = self.engine_factory(spec)
            engine.load(self._progress)
            self.model_loaded.set()
        except Exception as exc:  # noqa: BLE001 - shown to the user, never a traceback
            if not isinstance(exc, ChattermError):
                log.exception("model load failed")
            message = describe(exc)
            if engine is not None:
                _close_quietly(engine)
            self.target.post_message(LoadFailed(message))
            return
        if not self.lease.adopt(engine):
            return  # the app quit while the model loaded
        try:
            with self.lease.use():
                device = engine.device()
                # The GPU probe may import torch (seconds): here, off the UI thread.
                gpu = self.probe_gpu()
                energy = self._make_energy_meter() if gpu is not None else None
                self.target.post_message(EngineLoaded(engine, device, gpu, energy))
                self._prepare(engine, persona)
        except EngineClosing:
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("engine set-up failed")
            self.target.post_message(LoadFailed(describe(exc)))

    def prepare(self, persona: Persona) -> None:
        """Make `persona`'s prefix ready on the loaded engine (a thread worker)."""
        try:
            with self.lease.use() as engine:
                self._prepare(engine, persona)
        except EngineClosing:
            pass

    def poll_gpu(self) -> None:
        """Read the GPU's memory and power (a thread worker)."""
        self.target.post_message(GpuPolled(self.probe_gpu()))

    def probe_gpu(self) -> "GpuStatus | None":
        try:
            return self.gpu_probe()
        except Exception:  # noqa: BLE001 - no telemetry is "n/a", not an error
            log.debug("GPU probe failed", exc_info=True)
            return None

    def _progress(self, fraction: float) -> bool:
        """Report load progress; False (app quitting) makes the engine abandon the load."""
        self.target.post_message(LoadProgressed(fraction))
        return not self.lease.closing

    def _make_energy_meter(self) -> "EnergyMeter | None":
        try:
            return self.meter_factory()
        except Exception:  # noqa: BLE001 - no meter means energy shows "n/a"
            log.debug("no energy meter", exc_info=True)
            return None

    def _prepare(self, engine: Engine, persona: Persona) -> None:
        try:
            report = engine.prepare_persona(
                persona, lambda progress: self.target.post_message(PersonaProgressed(persona, progress))
            )
        except ChattermError as exc:
            self.target.post_message(PersonaPrepared(persona, None, str(exc)))
        except Exception as exc:  # noqa: BLE001
            log.exception("persona prepare failed")
            self.target.post_message(PersonaPrepared(persona, None, describe(exc)))
        else:
            self.target.post_message(PersonaPrepared(persona, report))


def _close_quietly(engine: Engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - the load error is the one to show
        log.debug("closing a half-loaded engine failed", exc_info=True)
