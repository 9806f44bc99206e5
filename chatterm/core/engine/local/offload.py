"""GPU offload decisions for the local engine: pure logic, no model loading here.

Contract:
- `plan_offload(spec, supports_gpu)` turns a model's `n_gpu_layers`, `flash_attn`
  and `kv_type` settings into the exact values the engine hands to
  `llama_cpp.Llama` (`OffloadPlan` fields), plus one-line notes for the dashboard.
  n_gpu_layers "auto" means every layer (-1) when llama.cpp has GPU offload, else 0.
  A quantized KV type with `flash_attn = false` is a `ChattermError`: llama.cpp
  refuses to quantize the V cache without flash attention ("Failed to create
  llama_context"), which would otherwise surface as an opaque load failure.
- `load_with_fallback(plan, try_load, n_layers)` calls `try_load(n_gpu_layers,
  flash_attn)`; when it fails with layers on the GPU (llama-cpp-python raises
  ValueError "Failed to load model from file" / "Failed to create llama_context"
  when the GPU is out of memory), it retries with half as many layers, down to
  one, then on the CPU, noting each retry in one line. A failure on the CPU is
  re-raised unchanged: the engine turns it into its own error.
- `gguf_block_count(path)` reads a GGUF header for the layer count, so the
  fallback can halve from the real number before any load succeeded.
- llama_cpp is imported only inside `kv_type_to_ggml`: deciding costs nothing.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, Callable, TypeVar

from chatterm.core.config.catalog import KV_TYPES, ModelSpec
from chatterm.errors import ChattermError

log = logging.getLogger(__name__)

T = TypeVar("T")

ALL_LAYERS = -1
"""llama-cpp-python's n_gpu_layers for "every layer" (it passes INT32_MAX on)."""

QUANTIZED_KV_TYPES = ("q8_0", "q4_0")

# Errors llama-cpp-python raises for a failed model load or context creation.
# Anything else (a ChattermError from the engine, a KeyboardInterrupt) is not
# a reason to try fewer layers.
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (ValueError, RuntimeError, MemoryError)


@dataclass(frozen=True)
class OffloadPlan:
    """What to pass to llama.cpp for one model, and what the user should know."""

    n_gpu_layers: int
    """-1 = every layer, 0 = CPU only, N = the model's last N layers (llama.cpp offloads from the end)."""
    flash_attn: bool
    kv_type: str
    """f16, q8_0 or q4_0 (the models.toml name)."""
    type_k: int
    """ggml type id of the K cache (llama_cpp.GGML_TYPE_*)."""
    type_v: int
    """ggml type id of the V cache."""
    notes: tuple[str, ...] = ()
    """One-line notes for DeviceInfo.notes (explicit setting ignored, fallbacks)."""

    @property
    def offloaded(self) -> bool:
        return self.n_gpu_layers != 0

    def layers_offloaded(self, n_layers: int | None) -> int | None:
        """Repeating layers on the GPU, for the dashboard ("30/30 layers on GPU").

        llama.cpp counts the output layer as one more offloadable layer (its log
        says "offloaded 31/31 layers" for SmolLM2's 30); the dashboard counts the
        model's own blocks, which is what `n_gpu_layers` in models.toml means.
        """
        if self.n_gpu_layers == ALL_LAYERS:
            return n_layers
        if n_layers is None:
            return self.n_gpu_layers
        return min(self.n_gpu_layers, n_layers)


def kv_type_to_ggml(name: str) -> int:
    """The ggml type id llama.cpp expects for a KV type name (f16, q8_0, q4_0)."""
    import llama_cpp  # the shared library loads here, not when chatterm starts

    types = {
        "f16": llama_cpp.GGML_TYPE_F16,
        "q8_0": llama_cpp.GGML_TYPE_Q8_0,
        "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    }
    try:
        return int(types[name])
    except KeyError:
        raise ChattermError(
            f"kv_type {name!r} is not one of {', '.join(KV_TYPES)}"
        ) from None


def plan_offload(spec: ModelSpec, supports_gpu: bool) -> OffloadPlan:
    """Decide offload, flash attention and KV types for `spec` (see module contract)."""
    notes: list[str] = []
    layers = spec.n_gpu_layers
    if layers == "auto":
        n_gpu_layers = ALL_LAYERS if supports_gpu else 0
    elif not supports_gpu and layers != 0:
        shown = "all" if layers == ALL_LAYERS else str(layers)
        notes.append(
            f"n_gpu_layers = {shown} ignored: this llama-cpp-python has no GPU offload "
            "(see docs/gpu.md); running on the CPU"
        )
        n_gpu_layers = 0
    else:
        n_gpu_layers = int(layers)

    quantized = spec.kv_type in QUANTIZED_KV_TYPES
    if isinstance(spec.flash_attn, bool):
        if quantized and not spec.flash_attn:
            raise ChattermError(
                f"model {spec.id!r}: kv_type {spec.kv_type!r} needs flash_attn = true or \"auto\" "
                "(llama.cpp cannot quantize the V cache without flash attention)"
            )
        flash_attn = spec.flash_attn
    else:
        # On the GPU flash attention is faster and keeps V untransposed, which
        # makes saving and restoring the persona KV state a plain copy.
        flash_attn = n_gpu_layers != 0 or quantized

    type_id = kv_type_to_ggml(spec.kv_type)
    return OffloadPlan(
        n_gpu_layers=n_gpu_layers,
        flash_attn=flash_attn,
        kv_type=spec.kv_type,
        type_k=type_id,
        type_v=type_id,
        notes=tuple(notes),
    )


def fallback_layers(start: int, n_layers: int | None) -> list[int]:
    """Layer counts to try after `start` failed: halving down to 1, then 0 (CPU).

    Without the model's layer count an "all layers" load can only fall back to
    the CPU.
    """
    if start == ALL_LAYERS:
        if n_layers is None:
            return [0]
        current = n_layers
    elif n_layers is not None:
        current = min(start, n_layers)
    else:
        current = start
    counts = []
    current //= 2
    while current >= 1:
        counts.append(current)
        current //= 2
    return counts + [0]


def _describe(n_gpu_layers: int, n_layers: int | None) -> str:
    if n_gpu_layers == ALL_LAYERS:
        return f"all {n_layers} layers" if n_layers is not None else "all layers"
    return f"{n_gpu_layers} layer" + ("" if n_gpu_layers == 1 else "s")


def load_with_fallback(
    plan: OffloadPlan,
    try_load: Callable[[int, bool], T],
    n_layers: int | None,
) -> tuple[T, OffloadPlan, list[str]]:
    """Load with `plan`, retrying with fewer GPU layers when a load fails.

    Returns the loaded object, the plan that worked (its notes extended with the
    retries) and the retry notes alone. flash_attn is kept across retries: the
    failure is about memory, and persona KV state files are only valid for the
    flash_attn setting they were saved with.
    """
    if not plan.offloaded:
        return try_load(0, plan.flash_attn), plan, []

    notes: list[str] = []
    attempt = plan.n_gpu_layers
    retries = fallback_layers(attempt, n_layers)
    while True:
        try:
            result = try_load(attempt, plan.flash_attn)
        except RETRYABLE_ERRORS as exc:
            if attempt == 0:
                raise
            nxt = retries.pop(0)
            log.warning("load with n_gpu_layers=%s failed: %s", attempt, exc)
            where = "on the CPU" if nxt == 0 else f"with {nxt}"
            # llama-cpp-python's error does not say why; with layers on the GPU
            # the usual cause is memory, hence the question mark.
            notes.append(
                f"load failed with {_describe(attempt, n_layers)} on the GPU "
                f"(out of GPU memory?); retried {where}"
            )
            attempt = nxt
            continue
        used = replace(plan, n_gpu_layers=attempt, notes=plan.notes + tuple(notes))
        return result, used, notes


# -- GGUF header -----------------------------------------------------------
# Only what is needed to find "<arch>.block_count": the key/value section is
# read in order and the scan stops as soon as the count is known (it comes
# before the large tokenizer arrays in files written by llama.cpp's converter).

_GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise EOFError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


_MAX_STRING = 1 << 24  # metadata strings are short; a huge length means a corrupt file


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > _MAX_STRING:
        raise ValueError("corrupt GGUF header (string length)")
    data = f.read(n)
    if len(data) != n:
        raise EOFError("truncated GGUF header")
    return data.decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _read_string(f)
    if vtype == _ARRAY:
        item_type = _read(f, "<I")
        count = _read(f, "<Q")
        if item_type in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
        else:
            for _ in range(count):
                _read_value(f, item_type)
        return None
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_block_count(path: Path) -> int | None:
    """The model's layer count from its GGUF metadata, or None when unreadable."""
    try:
        with open(path, "rb") as f:
            if f.read(4) != _GGUF_MAGIC:
                return None
            version = _read(f, "<I")
            if version < 2:
                return None
            _read(f, "<Q")  # tensor count
            n_kv = _read(f, "<Q")
            arch = None
            counts: dict[str, int] = {}
            for _ in range(n_kv):
                key = _read_string(f)
                value = _read_value(f, _read(f, "<I"))
                if key == "general.architecture":
                    arch = value
                elif key.endswith(".block_count") and isinstance(value, int):
                    counts[key] = value
                if arch is not None and f"{arch}.block_count" in counts:
                    return counts[f"{arch}.block_count"]
    except (OSError, EOFError, ValueError, struct.error, MemoryError, OverflowError) as exc:
        log.debug("cannot read GGUF header of %s: %s", path, exc)
    return None
