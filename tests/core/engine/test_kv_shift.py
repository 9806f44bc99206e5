"""A context shift on the real default model: the moved keys are rotated at the
next decode, which an abort asked for meanwhile (Enter stopping a type-ahead
batch) must not interrupt, or some layers are rotated twice."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from chatterm.core.engine.local import kv_shift, kv_state
from chatterm.core.engine.local.model import AbortFlag
from chatterm.core.workspace import Workspace

KEEP, SPAN = 8, 24


def open_llm() -> llama_cpp.Llama:
    path = Workspace.load().catalog.get(None).model_path()
    return llama_cpp.Llama(str(path), n_ctx=512, n_batch=512, n_gpu_layers=0, verbose=False)


def shifted_logits(llm: llama_cpp.Llama, tokens: list[int], flag: AbortFlag | None) -> np.ndarray:
    """Evaluate `tokens`, shift SPAN of them out after KEEP, then decode one
    more token (with an abort asked for while `flag` holds); its logits."""
    llm.reset()
    llm.eval(tokens)
    assert kv_shift.shift(llm, KEEP, SPAN)
    if flag is not None:
        flag.hold()
        flag.set(True)  # as a turn's Enter does to a type-ahead batch
    llm.eval(tokens[-1:])
    return np.array(llm.scores[llm.n_tokens - 1])


def test_an_abort_asked_for_meanwhile_waits_for_the_rotation_and_then_stops_the_next_decode():
    llm = open_llm()
    try:
        tokens = llm.tokenize(b"One two three four five six seven eight nine ten. " * 6)
        expected = shifted_logits(llm, tokens, None)
        flag = AbortFlag()
        flag.install(llm)
        held = shifted_logits(llm, tokens, flag)  # not aborted: the rotation ran whole
        np.testing.assert_allclose(held, expected, rtol=1e-4, atol=1e-4)
        assert flag.is_set
        flag.release()  # after that decode: the abort asked for now applies
        with pytest.raises(RuntimeError):
            llm.eval(tokens[:1])
        flag.set(False)
    finally:
        llm.close()


def test_the_decode_that_rotates_is_one_token_so_a_held_stop_waits_milliseconds():
    """The abort is held through the first decode after a shift: a whole
    first batch (hundreds of tokens, seconds on a CPU) then ignored Esc."""
    llm = open_llm()
    try:
        tokens = llm.tokenize(b"One two three four five six seven eight nine ten. " * 6)
        llm.eval(tokens)
        assert kv_shift.shift(llm, KEEP, SPAN)
        batches: list[int] = []
        released: list[int] = []
        kv_state.prefill(llm, tokens[:40], lambda p: batches.append(p.batch),
                         decoded=lambda: released.append(len(batches)), first=1)
        assert batches[0] == 1 and sum(batches) == 40 and len(batches) >= 2
        assert released[0] == 0  # released after that first decode, before its progress
    finally:
        llm.close()
