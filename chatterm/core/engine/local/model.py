"""Opening a GGUF model in llama.cpp, and the abort flag that lets a cancel stop a prefill.

Contract:
- `open_model(spec, progress)` checks that the file is a readable GGUF (else a
  one-line ChattermError naming the path), routes llama.cpp's log into Python
  logging, plans the GPU offload (`chatterm.core.engine.local.offload`) and loads with
  llama.cpp's progress callback (0..0.9 of `progress`; a False from it stops
  the load), falling back to fewer GPU layers when the planned load fails. A
  load that fails for good is one ChattermError carrying llama.cpp's first
  error, the specific one. The device name (a GPU probe or /proc/cpuinfo) is
  worked out here, once.
- `BatchThreads` picks how many threads llama.cpp prefills with, before each
  prefill: the models.toml `n_threads_batch` when set, else one per core this
  process may run on (llama-cpp-python's default counts every core of the
  machine, also those an affinity mask or a container leaves out) less the
  cores other processes keep busy at normal priority (`OtherLoad`). llama.cpp's
  threads meet at a spinning barrier after every graph node, so a thread that
  has to share its core with another process stalls all of them: measured on
  2 cores with one busy process, a 2-thread prefill is 1.3-3x slower than a
  1-thread one (docs/engine.md, benchmarks/prefill_threads.py).
- `AbortFlag` is llama.cpp's abort callback for one context: `set(True)`
  makes the decode in progress stop at its next graph node (CPU backend), and
  the decode raises RuntimeError; `set(False)` before the next decode.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from chatterm.core.config.catalog import ModelSpec
from chatterm.core.engine.interface import Progress
from chatterm.core.engine.local import llama_log, offload
from chatterm.core.system.machine import OtherLoad, cpu_name
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)

# llama-cpp-python reads llama_model_default_params() inside Llama.__init__ and
# offers no way to pass a progress callback; we swap the function for the
# duration of one load, under this lock.
_params_patch_lock = threading.Lock()


@dataclass(frozen=True)
class OpenedModel:
    llm: llama_cpp.Llama
    plan: offload.OffloadPlan
    """The offload plan that loaded (after any fallback)."""
    notes: tuple[str, ...]
    """What the fallback changed, for the user."""
    device_name: str


def open_model(spec: ModelSpec, progress: Progress | None = None) -> OpenedModel:
    path = spec.model_path()
    _check_gguf(path)
    llama_log.install()
    plan = offload.plan_offload(spec, llama_cpp.llama_supports_gpu_offload())

    def try_load(n_gpu_layers: int, flash_attn: bool) -> llama_cpp.Llama:
        with _load_progress(progress):
            return llama_cpp.Llama(
                str(path),
                n_ctx=spec.n_ctx,
                n_gpu_layers=n_gpu_layers,
                flash_attn=flash_attn,
                type_k=plan.type_k,
                type_v=plan.type_v,
                n_threads=spec.n_threads,
                n_threads_batch=spec.n_threads_batch,
                verbose=False,
            )

    with llama_log.capture_errors() as errors:
        try:
            llm, loaded_plan, notes = offload.load_with_fallback(plan, try_load, offload.gguf_block_count(path))
        except (ValueError, RuntimeError, MemoryError) as exc:
            # llama.cpp's first error is the specific one ("tensor ... not
            # within the file bounds"); later ones just say the load failed.
            reason = errors[0].strip() if errors else str(exc)
            raise ChattermError(f"{path}: llama.cpp could not load the model: {reason}") from None
    on_gpu = bool(loaded_plan.layers_offloaded(llama_cpp.llama_model_n_layer(llm.model)))
    return OpenedModel(llm, loaded_plan, tuple(notes), _gpu_name() if on_gpu else cpu_name())


class BatchThreads:
    """The prefill thread count of one context (see the module docstring).
    Made before the model loads, so that the load of other processes is
    already known at the first prefill; `bind()` it to the loaded model."""

    def __init__(self, adaptive: bool = True):
        self._llm: llama_cpp.Llama | None = None
        self._adaptive = adaptive
        self._most = self.current = 1
        try:
            self._cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cores = os.cpu_count() or 1
        self._load = OtherLoad().start() if adaptive and self._cores > 1 else None

    def bind(self, llm: llama_cpp.Llama) -> None:
        self._llm = llm
        self._most = self.current = llm.n_threads_batch
        if self._adaptive:
            self._most = min(self._most, self._cores)

    def apply(self) -> int:
        """Set the thread count for the next prefill; returns it."""
        assert self._llm is not None, "bind() the loaded model first"
        wanted = self._most
        others = self._load.cores if self._load is not None else None
        if others is not None:
            # A core another process keeps busy at least half the time is taken.
            wanted = max(1, min(self._most, self._cores - int(others + 0.5)))
        if wanted != self.current:
            log.debug("prefill threads %d -> %d (other processes busy: %s cores)", self.current, wanted,
                      "?" if others is None else f"{others:.1f}")
            llama_cpp.llama_set_n_threads(self._llm.ctx, self._llm.n_threads, wanted)
            self.current = wanted
        return wanted

    def close(self) -> None:
        if self._load is not None:
            self._load.stop()


class AbortFlag:
    """Let a cancel interrupt a long prefill (CPU backend only).

    llama.cpp calls the abort callback from its compute thread before every
    graph node. A Python callback would take the GIL ~1,000 times per decode,
    and wait up to the 5 ms switch interval each time the UI thread holds it.
    So the callback is libc's `strlen`, pointed at a two-byte buffer: it
    returns 1 (true) once byte 0 is set, 0 otherwise, with no Python involved.
    """

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(2)
        self._callback = None  # kept referenced: llama.cpp holds the pointer

    def install(self, llm: llama_cpp.Llama) -> None:
        try:
            strlen = ctypes.CDLL(None).strlen
        except (OSError, AttributeError):  # no libc symbols (e.g. Windows): cancel waits for the prefill
            return
        self._callback = llama_cpp.ggml_abort_callback(ctypes.cast(strlen, ctypes.c_void_p).value)
        llama_cpp.llama_set_abort_callback(llm.ctx, self._callback, ctypes.cast(self._buffer, ctypes.c_void_p))

    def set(self, on: bool) -> None:
        self._buffer[0] = b"\x01" if on else b"\x00"

    @property
    def is_set(self) -> bool:
        return self._buffer[0] == b"\x01"


@contextlib.contextmanager
def _load_progress(progress: Progress | None):
    if progress is None:
        yield
        return

    @llama_cpp.llama_progress_callback
    def on_progress(value: float, _user_data) -> bool:
        try:
            # False from the caller (the app is quitting) makes llama.cpp stop loading.
            return progress(min(max(float(value), 0.0), 1.0) * 0.9) is not False
        except Exception:  # noqa: BLE001 - never raise into C
            return True

    original = llama_cpp.llama_cpp.llama_model_default_params

    def with_callback():
        params = original()
        params.progress_callback = on_progress
        return params

    with _params_patch_lock:
        llama_cpp.llama_cpp.llama_model_default_params = with_callback
        try:
            yield
        finally:
            llama_cpp.llama_cpp.llama_model_default_params = original


def _check_gguf(path: Path) -> None:
    if not path.exists():
        raise ChattermError(f"{path}: model file not found")
    if not path.is_file():
        raise ChattermError(f"{path}: not a file")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ChattermError(f"{path}: cannot read model file: {exc.strerror}") from None
    if magic != b"GGUF":
        raise ChattermError(f"{path}: not a GGUF model file (bad magic {magic!r})")


def _gpu_name() -> str:
    from chatterm.core.system.gpu import gpu_status

    status = gpu_status()
    return status.name if status is not None else "GPU (llama.cpp offload)"
