"""KV state primitives over a `llama_cpp.Llama`'s sequence 0: capture, restore,
trim, and a chunked prefill with progress that can be stopped between batches.

Contract:
- `capture(llm)` copies sequence 0's KV state (its size grows linearly with
  the tokens held) and the N tokens it holds. The payload is a writable ctypes buffer: it can be kept in
  RAM, written to a file, or handed back to `restore` without another copy.
- `restore(llm, payload, tokens, verify)` loads a payload that the caller has
  already matched to this model and build (llama.cpp itself would accept a
  state from another model, rope setting or build: see `compat_fields`).
  It returns None, or a one-line reason after clearing the context. On success
  `input_ids`/`n_tokens` describe the restored tokens and the logits are marked
  missing (a state holds none): the next decode must re-evaluate at least the
  last token, which `Llama.generate` does. `verify`, when given, runs in a
  second thread while llama.cpp copies the payload in; False rejects it. The
  restored cell count is checked against `tokens` too.
- `trim(llm, n)` keeps the first n tokens of the context. Returns False (and
  clears the context) when the memory cannot drop a suffix (recurrent models).
- `prefill(llm, tokens, on_progress, abort)` evaluates `tokens` after what the
  context holds, one batch (`llm.n_batch`) at a time, calls `on_progress` after
  each batch and stops between batches once `abort` is set. What was evaluated
  stays in the context, so an interrupted prefill is not wasted.
- `compat_fields(...)` is every property a state depends on beyond its tokens:
  model file, llama.cpp build, architecture, context size, KV types, flash
  attention (with it off the V cache is stored transposed) and rope settings.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import llama_cpp

from chatterm.core.engine.interface import PrefillProgress
from chatterm.core.system.file_identity import sha256_of_file


@dataclass
class CapturedState:
    tokens: list[int]
    payload: Any
    """A writable buffer (ctypes array) holding `llama_state_seq_get_data` output."""

    @property
    def nbytes(self) -> int:
        return memoryview(self.payload).nbytes


def capture(llm: llama_cpp.Llama) -> CapturedState:
    """Sequence 0's state and the tokens it holds."""
    ctx = llm.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)
    if written != size:  # never seen; keep exactly what llama.cpp wrote
        buffer = (ctypes.c_uint8 * written).from_buffer_copy(memoryview(buffer)[:written])
    return CapturedState(llm.input_ids[: llm.n_tokens].tolist(), buffer)


def clear(llm: llama_cpp.Llama) -> None:
    """An empty context (the only safe state after a failed restore)."""
    llm.reset()
    llm._ctx.kv_cache_seq_rm(-1, 0, -1)


def _cells(llm: llama_cpp.Llama) -> int:
    """Positions held by sequence 0 (max position + 1; 0 when empty)."""
    memory = llama_cpp.llama_get_memory(llm.ctx)
    return int(llama_cpp.llama_memory_seq_pos_max(memory, 0)) + 1


def restore(
    llm: llama_cpp.Llama,
    payload: Any,
    tokens: Sequence[int],
    verify: Callable[[], bool] | None = None,
) -> str | None:
    """Load `payload` (the state of exactly `tokens`) into sequence 0; None or why not."""
    clear(llm)
    verdict: list[bool] = []
    checker = None
    if verify is not None:
        # Digests on another core while llama.cpp copies (both release the GIL).
        checker = threading.Thread(target=lambda: verdict.append(bool(verify())), daemon=True)
        checker.start()
    view = memoryview(payload).cast("B")
    size = view.nbytes
    if view.readonly:
        buffer = (ctypes.c_uint8 * size).from_buffer_copy(view)
    else:
        buffer = (ctypes.c_uint8 * size).from_buffer(view)
    # The sequence API, not llama_state_set_data: that one first clears the
    # whole n_ctx-sized KV buffer.
    used = llama_cpp.llama_state_seq_set_data(llm.ctx, buffer, size, 0)
    del buffer
    view.release()
    if checker is not None:
        checker.join()
    reason = None
    if used == 0:
        reason = "rejected by llama.cpp"
    elif checker is not None and not (verdict and verdict[0]):
        reason = "payload checksum mismatch"
    elif len(tokens) > llm.n_ctx():
        reason = f"{len(tokens)} tokens do not fit the {llm.n_ctx()}-token context"
    elif _cells(llm) != len(tokens):
        reason = f"payload holds {_cells(llm)} positions, header says {len(tokens)} tokens"
    if reason is not None:
        clear(llm)  # llama.cpp may have loaded some cells
        return reason
    n = len(tokens)
    llm.input_ids[:n] = tokens
    llm.n_tokens = n
    llm._requires_eval = True  # no logits in a state: the next decode must re-evaluate
    return None


def trim(llm: llama_cpp.Llama, n: int) -> bool:
    """Keep the first `n` tokens of the context; False (context cleared) if impossible."""
    if n >= llm.n_tokens:
        return True
    if n <= 0:
        clear(llm)
        return True
    if not llm._ctx.kv_cache_seq_rm(0, n, -1):
        clear(llm)
        return False
    llm.n_tokens = n
    llm._requires_eval = True
    return True


@dataclass(frozen=True)
class PrefillResult:
    done: int
    total: int
    ms: float
    aborted: bool


def prefill(
    llm: llama_cpp.Llama,
    tokens: Sequence[int],
    on_progress: Callable[[PrefillProgress], None] | None = None,
    abort: threading.Event | None = None,
    batch: int | None = None,
    decoded: Callable[[], None] | None = None,
    first: int | None = None,
) -> PrefillResult:
    """Evaluate `tokens` after the context's current ones, batch by batch;
    `decoded()` after each batch's decode (before `on_progress`); `first`: the
    first batch's size, when it must be short (it runs while nothing may stop it)."""
    step = max(1, min(batch or llm.n_batch, llm.n_batch))
    offset = llm.n_tokens
    tokens = list(tokens)
    total = len(tokens)
    t0 = time.perf_counter()
    done = 0
    while done < total:
        if abort is not None and abort.is_set():
            break
        chunk = tokens[done : done + (min(step, first) if first and not done else step)]
        t_batch = time.perf_counter()
        llm.eval(chunk)
        done += len(chunk)
        if decoded is not None:
            decoded()
        if on_progress is not None:
            now = time.perf_counter()
            on_progress(PrefillProgress(done, total, now - t0, len(chunk), now - t_batch, offset))
    return PrefillResult(done, total, (time.perf_counter() - t0) * 1000.0, done < total)


def llama_library_sha256() -> str:
    """Identity of the llama.cpp build (restore accepts another build silently)."""
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libllama.so", "libllama.dylib", "llama.dll"):
        if (lib_dir / name).exists():
            return sha256_of_file(lib_dir / name)
    return "unknown"


def compat_fields(llm: llama_cpp.Llama, model_path: Path, model_sha256: str, flash_attn: bool) -> dict[str, Any]:
    """Everything a KV state depends on besides its tokens (JSON-ready). Not
    the context size: a sequence's state holds its own cells and restores into
    any context with room for them (`restore` checks), so `chatterm ask`'s
    one-turn context and the TUI's whole one share their states."""
    meta = llm.metadata
    arch = meta.get("general.architecture", "")
    cp = llm.context_params
    return {
        "model_sha256": model_sha256,
        "model_size": model_path.stat().st_size,
        "llama_cpp_python": llama_cpp.__version__,
        "llama_cpp_build": llama_library_sha256(),
        "architecture": arch,
        "n_layer": llama_cpp.llama_model_n_layer(llm.model),
        "n_swa": llama_cpp.llama_model_n_swa(llm.model),
        "type_k": int(cp.type_k),
        "type_v": int(cp.type_v),
        "flash_attn": bool(flash_attn),
        "rope": {
            "freq_base": meta.get(f"{arch}.rope.freq_base"),
            "freq_scale_train": llama_cpp.llama_model_rope_freq_scale_train(llm.model),
            "scaling_type": meta.get(f"{arch}.rope.scaling.type"),
            "ctx_freq_base": cp.rope_freq_base,
            "ctx_freq_scale": cp.rope_freq_scale,
            "yarn": [cp.yarn_ext_factor, cp.yarn_attn_factor, cp.yarn_beta_fast,
                     cp.yarn_beta_slow, cp.yarn_orig_ctx],
        },
        "lora": None,
    }
