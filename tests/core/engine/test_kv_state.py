"""KV state primitives on the real default model: capture, restore, trim, prefill."""

from __future__ import annotations

import threading

import llama_cpp
import pytest

from chatterm.core.engine.local import kv_state, llama_log
from chatterm.core.workspace import Workspace

TEXT = b"A short story. The lighthouse keeper counted ships every night and wrote their names down."


@pytest.fixture(scope="module")
def spec():
    llama_log.install()
    return Workspace.load().catalog.get(None)


def make_llm(spec) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(spec.model_path()), n_ctx=512, n_batch=512, verbose=False)


@pytest.fixture(scope="module")
def pair(spec):
    """Two independent contexts on the model: a writer and a fresh reader."""
    a, b = make_llm(spec), make_llm(spec)
    yield a, b
    a.close()
    b.close()


def greedy(llm, prompt, n=8) -> list[int]:
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return out


def uncached(llm, prompt) -> list[int]:
    kv_state.clear(llm)
    return greedy(llm, prompt)


@pytest.fixture(scope="module")
def prompt(pair):
    return pair[0].tokenize(TEXT, add_bos=False, special=True)


def test_captured_state_restored_in_another_context_continues_identically(pair, prompt):
    a, b = pair
    reference = uncached(a, prompt)
    kv_state.clear(a)
    kv_state.prefill(a, prompt)
    state = kv_state.capture(a)
    assert state.tokens == prompt
    assert state.nbytes > 10_000 * len(prompt)  # a real KV state, not a header
    blob = bytes(state.payload)  # as it would come back from a file: read-only bytes

    assert kv_state.restore(b, blob, prompt) is None
    assert b.n_tokens == len(prompt) and b.input_ids[: len(prompt)].tolist() == prompt
    assert b._requires_eval  # no logits: generate must re-decode the last token
    assert greedy(b, prompt) == reference


def test_restore_checks_the_token_count_and_the_digest_and_clears_on_failure(pair, prompt):
    a, b = pair
    kv_state.clear(a)
    kv_state.prefill(a, prompt)
    state = kv_state.capture(a)

    reason = kv_state.restore(b, state.payload, prompt[:-2])
    assert reason and "positions" in reason
    assert b.n_tokens == 0 and kv_state._cells(b) == 0

    assert kv_state.restore(b, state.payload, prompt, verify=lambda: False) == "payload checksum mismatch"
    assert b.n_tokens == 0 and kv_state._cells(b) == 0

    garbage = bytearray(state.payload)
    garbage[:16] = b"\xff" * 16
    assert kv_state.restore(b, garbage, prompt) == "rejected by llama.cpp"
    assert b.n_tokens == 0 and kv_state._cells(b) == 0

    half = bytearray(state.payload)[: state.nbytes // 2]
    assert kv_state.restore(b, half, prompt) == "rejected by llama.cpp"
    assert b.n_tokens == 0 and kv_state._cells(b) == 0
    # The context is still usable after all that.
    assert greedy(b, prompt) == uncached(a, prompt)


def test_trim_to_a_shared_prefix_then_prefill_the_rest(pair, prompt):
    a, b = pair
    kv_state.clear(a)
    kv_state.prefill(a, prompt)
    state = kv_state.capture(a)
    other = prompt[:12] + a.tokenize(b" Then a storm came and nobody slept.", add_bos=False, special=False)
    reference = uncached(a, other)

    assert kv_state.restore(b, state.payload, prompt) is None
    assert kv_state.trim(b, 12)
    assert b.n_tokens == 12 and kv_state._cells(b) == 12
    assert greedy(b, other) == reference


def test_prefill_reports_progress_and_stops_between_batches(pair, prompt):
    a, b = pair
    reference = uncached(a, prompt)
    kv_state.clear(b)
    abort = threading.Event()
    seen = []

    def on_progress(p):
        seen.append((p.done, p.total))
        assert p.rate > 0 and p.eta_s is not None and p.eta_s >= 0
        abort.set()  # stop after the first batch

    result = kv_state.prefill(b, prompt[:-1], on_progress, abort, batch=8)
    assert result.aborted and result.done == 8 and seen == [(8, len(prompt) - 1)]
    assert b.n_tokens == 8  # what was done stays in the context

    seen.clear()
    rest = kv_state.prefill(b, prompt[8:-1], lambda p: seen.append(p.done), batch=8)
    assert not rest.aborted and seen[-1] == len(prompt) - 9 and b.n_tokens == len(prompt) - 1
    assert seen == sorted(seen) and len(seen) == -(-(len(prompt) - 9) // 8)
    assert greedy(b, prompt) == reference  # generate decodes only the last prompt token


def test_compat_fields_name_everything_a_state_depends_on(pair, spec):
    fields = kv_state.compat_fields(pair[0], spec.model_path(), "ab" * 32, flash_attn=False)
    for key in ("model_sha256", "model_size", "llama_cpp_python", "llama_cpp_build", "architecture",
                "n_layer", "n_swa", "type_k", "type_v", "flash_attn", "rope"):
        assert key in fields, key
    assert fields["architecture"] == "llama"
    # A sequence state restores into any context with room for its cells.
    assert "n_ctx" not in fields
    assert len(fields["llama_cpp_build"]) == 64
