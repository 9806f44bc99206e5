"""Opening a GGUF model in llama.cpp, and the abort flag that lets a cancel stop a prefill.

Contract:
- `open_model(spec, progress)` checks that the file is a readable GGUF (else a
  one-line ChattermError naming the path), routes llama.cpp's log into Python
  logging, plans the GPU offload (`chatterm.core.engine.local.offload`) and loads with
  llama.cpp's progress callback (0..0.9 of `progress`; a False from it stops
  the load), falling back to fewer GPU layers when the planned load fails. A
  load that fails for good is one ChattermError carrying llama.cpp's first
  error, the specific one. The device name (a GPU probe or /proc/cpuinfo) is
  worked out here, once, with whether any layer went to a GPU.
- `Threads` picks how many threads llama.cpp decodes and prefills with,
  before each prefill, between its batches, and every `RECHECK_TOKENS` tokens
  of a reply (so a process that starts mid-reply gets its core back within a
  fraction of a second, and one that ends gives it back): the models.toml
  `n_threads` / `n_threads_batch` when set, else one per physical core this
  process may run on (`machine.physical_cores`: its affinity mask and the OS's
  sibling lists; llama-cpp-python's own default halves the machine's CPU
  count for decode and counts CPUs an affinity mask or a container leaves
  out) less the cores other processes keep busy at normal priority
  (`OtherLoad`). llama.cpp's threads meet at a spinning barrier after every
  graph node, so a thread that has to share its core with another process
  stalls all of them: measured on 2 cores with one busy process, a 2-thread
  prefill is 1.3-3x slower than a 1-thread one and a 2-thread decode about 4x
  slower (docs/engine.md, benchmarks/prefill_threads.py,
  benchmarks/decode_threads.py). `threads_in_use(llm)` reads back the counts
  llama.cpp holds.
- `AbortFlag` is llama.cpp's abort callback for one context: `set(True)`
  makes the decode in progress stop at its next graph node (CPU backend), and
  the decode raises RuntimeError; `set(False)` before the next decode.
  `hold()` (after a context shift) keeps it from stopping the next decode
  until `release()`: llama.cpp re-rotates the moved keys in place, layer by
  layer, at the start of that decode, and an abort midway left some layers
  rotated and the shift pending, so they were rotated twice.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass

import llama_cpp

from chatterm.core.config.catalog import ModelSpec
from chatterm.core.engine.interface import Progress
from chatterm.core.engine.local import early_load, llama_log, offload
from chatterm.core.metrics.format import counted
from chatterm.core.system.machine import OtherLoad, cpu_name, physical_cores, usable_cpus
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class OpenedModel:
    llm: llama_cpp.Llama
    plan: offload.OffloadPlan
    """The offload plan that loaded (after any fallback)."""
    notes: tuple[str, ...]
    """What the fallback changed, for the user."""
    device_name: str
    on_gpu: bool
    """Layers of the model are on a GPU: its first decode may carry one-time
    costs such as kernel loading."""


def open_model(spec: ModelSpec, progress: Progress | None = None) -> OpenedModel:
    path = spec.gguf_file()
    llama_log.install()
    plan = offload.plan_offload(spec, llama_cpp.llama_supports_gpu_offload())

    cores = physical_cores()

    def try_load(n_gpu_layers: int, flash_attn: bool) -> llama_cpp.Llama:
        with early_load.reporting(progress):
            return llama_cpp.Llama(
                str(path),
                n_ctx=spec.n_ctx,
                n_gpu_layers=n_gpu_layers,
                flash_attn=flash_attn,
                type_k=plan.type_k,
                type_v=plan.type_v,
                n_threads=spec.n_threads or cores,
                n_threads_batch=spec.n_threads_batch or cores,
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
    return OpenedModel(llm, loaded_plan, tuple(notes), _gpu_name() if on_gpu else cpu_name(), on_gpu)


RECHECK_TOKENS = 16
"""Tokens of a reply between two looks at the other processes' load: a fraction
of a second at typical decode speeds, and `OtherLoad` samples every 0.5 s."""


class Threads:
    """The decode and prefill thread counts of one context (see the module
    docstring). Made before the model loads, so that the load of other
    processes is already known at the first prefill; `bind()` it to the loaded
    model, whose counts are the most it uses. A count that is not adaptive
    (set in models.toml) stays as loaded."""

    def __init__(self, adapt_decode: bool = True, adapt_batch: bool = True):
        self._llm: llama_cpp.Llama | None = None
        self._adapt_decode, self._adapt_batch = adapt_decode, adapt_batch
        self.cores = physical_cores()
        self._most_decode = self._most_batch = 1
        self.decode = self.batch = 1
        adaptive = adapt_decode or adapt_batch
        self._load = OtherLoad().start() if adaptive and len(usable_cpus()) > 1 else None

    def bind(self, llm: llama_cpp.Llama) -> None:
        self._llm = llm
        self.decode, self.batch = threads_in_use(llm)
        # The counts it was loaded with: llama_set_n_threads leaves these alone.
        self._most_decode = min(llm.n_threads, self.cores) if self._adapt_decode else llm.n_threads
        self._most_batch = min(llm.n_threads_batch, self.cores) if self._adapt_batch else llm.n_threads_batch

    def apply(self) -> int:
        """Set the thread counts for the next prefill and the decode after it;
        returns the prefill count."""
        assert self._llm is not None, "bind() the loaded model first"
        others = self._load.cores if self._load is not None else None
        # A core another process keeps busy at least half the time is taken.
        free = self.cores - int(others + 0.5) if others is not None else self.cores
        decode = max(1, min(self._most_decode, free)) if self._adapt_decode else self._most_decode
        batch = max(1, min(self._most_batch, free)) if self._adapt_batch else self._most_batch
        if (decode, batch) != (self.decode, self.batch):
            log.debug("threads %d/%d -> %d/%d decode/prefill (other processes busy: %s cores)",
                      self.decode, self.batch, decode, batch, "?" if others is None else f"{others:.1f}")
            llama_cpp.llama_set_n_threads(self._llm.ctx, decode, batch)
            self.decode, self.batch = decode, batch
        return batch

    def describe(self) -> str:
        """The counts in use, for the dashboard: "2 decode · 2 prefill of 2 cores"."""
        text = f"{self.decode} decode · {self.batch} prefill of {counted(self.cores, 'core')}"
        return f"{text} (fewer while others keep cores busy)" if self._load is not None else text

    def close(self) -> None:
        if self._load is not None:
            self._load.stop()


def threads_in_use(llm: llama_cpp.Llama) -> tuple[int, int]:
    """(decode, prefill) thread counts llama.cpp holds for `llm`'s context."""
    return llama_cpp.llama_n_threads(llm.ctx), llama_cpp.llama_n_threads_batch(llm.ctx)


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
        self._lock = threading.Lock()
        self._wanted = False
        """The flag as set; the buffer holds it unless `hold()` keeps it off."""
        self._held = False

    def install(self, llm: llama_cpp.Llama) -> None:
        try:
            strlen = ctypes.CDLL(None).strlen
        except (OSError, AttributeError):  # no libc symbols (e.g. Windows): cancel waits for the prefill
            return
        self._callback = llama_cpp.ggml_abort_callback(ctypes.cast(strlen, ctypes.c_void_p).value)
        llama_cpp.llama_set_abort_callback(llm.ctx, self._callback, ctypes.cast(self._buffer, ctypes.c_void_p))

    def set(self, on: bool) -> None:
        with self._lock:
            self._wanted = on
            if not self._held:
                self._buffer[0] = b"\x01" if on else b"\x00"

    def hold(self) -> None:
        """Let nothing stop a decode until `release()` (a set meanwhile waits for it)."""
        with self._lock:
            self._held = True
            self._buffer[0] = b"\x00"

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._buffer[0] = b"\x01" if self._wanted else b"\x00"

    @property
    def is_set(self) -> bool:
        return self._wanted

    @property
    def held(self) -> bool:
        return self._held


def _gpu_name() -> str:
    from chatterm.core.system.gpu import gpu_status

    status = gpu_status()
    return status.name if status is not None else "GPU (llama.cpp offload)"
