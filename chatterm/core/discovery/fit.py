"""Whether a model fits this machine, and the context length it gets by default.

Contract:
- `machine_memory()`: the GPU's free memory when NVML (the `gpu` extra's
  nvidia-ml-py, else `nvidia-smi`) sees an NVIDIA GPU and this llama.cpp
  can offload to one, all GPUs together (llama.cpp spreads layers across
  them); else `ram()`, the RAM available (/proc/meminfo MemAvailable,
  elsewhere free physical pages). A models.toml entry with `n_gpu_layers = 0`
  is judged against `ram()` (`listing.describe`).
- A model needs its file size (the weights) plus its KV cache at n_ctx:
  `kv_bytes_per_token(facts, kv_type)` x n_ctx, the header's f16 figure
  scaled to the KV type's bytes per element (q8_0 and q4_0 store 32
  elements in 34 and 18 bytes); `BUDGET_SHARE` of the memory is counted as
  usable, the rest is left for llama.cpp's compute buffers and everything
  else running.
- `fits(facts, memory, n_ctx, kv_type)`: whether a context a models.toml
  entry sets fits.
- `default_n_ctx(facts, memory)`: the trained context, or less when the KV
  cache would not fit beside the weights, then in multiples of 256; None when not
  even `MIN_CTX` tokens (or the trained context, if shorter) fit: the model
  does not fit this machine. A header without the KV numbers gets
  `FALLBACK_CTX` and is judged by its weights alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from chatterm.core.discovery.gguf_facts import GgufFacts

BUDGET_SHARE = 0.9
MIN_CTX = 2048
FALLBACK_CTX = 4096
CTX_STEP = 256
KV_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
"""Bytes per KV element: ggml's q8_0 and q4_0 blocks hold 32 elements in 34 and 18 bytes."""


@dataclass(frozen=True)
class Memory:
    kind: Literal["GPU", "RAM"]
    available_bytes: int


def _nvml_free() -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            return sum(int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free)
                       for i in range(count)) or None
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no permission: "no GPU" for this estimate
        return None


def _nvidia_smi_free() -> int | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
        return sum(int(line) for line in out.split()) * (1 << 20) or None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _ram_available() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def machine_memory() -> Memory:
    gpu = _nvml_free()
    if gpu is None:
        gpu = _nvidia_smi_free()
    if gpu is not None and _llama_offloads():
        return Memory("GPU", gpu)
    return ram()


def ram() -> Memory:
    return Memory("RAM", _ram_available())


def _llama_offloads() -> bool:
    """Whether this llama-cpp-python can put layers on a GPU: the plain wheel
    cannot, and a model judged against the GPU's memory then loads into RAM.
    (Imported only where a GPU is seen: 0.2 s.)"""
    try:
        import llama_cpp
    except Exception:  # noqa: BLE001 - a broken install loads nothing anywhere
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


def kv_bytes_per_token(facts: GgufFacts, kv_type: str = "f16") -> int | None:
    if facts.kv_bytes_per_token is None:
        return None
    return round(facts.kv_bytes_per_token * KV_TYPE_BYTES[kv_type] / KV_TYPE_BYTES["f16"])


def needed_bytes(facts: GgufFacts, n_ctx: int, kv_type: str = "f16") -> int:
    return facts.file_size + (kv_bytes_per_token(facts, kv_type) or 0) * n_ctx


def _budget(memory: Memory) -> int:
    return int(memory.available_bytes * BUDGET_SHARE)


def fits(facts: GgufFacts, memory: Memory, n_ctx: int, kv_type: str = "f16") -> bool:
    return needed_bytes(facts, n_ctx, kv_type) <= _budget(memory)


def default_n_ctx(facts: GgufFacts, memory: Memory) -> int | None:
    budget = _budget(memory)
    trained = facts.context_length or FALLBACK_CTX
    if not facts.kv_bytes_per_token:
        n_ctx = min(trained, FALLBACK_CTX)
        return n_ctx if facts.file_size <= budget else None
    room = (budget - facts.file_size) // facts.kv_bytes_per_token
    n_ctx = min(trained, room)
    if room < trained and n_ctx >= CTX_STEP:  # cut to a step; a trained 514 fits as 514, not 512
        n_ctx -= n_ctx % CTX_STEP
    return n_ctx if n_ctx >= min(MIN_CTX, trained) and n_ctx > 0 else None
