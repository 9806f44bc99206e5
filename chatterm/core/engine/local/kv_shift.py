"""Removing a span of tokens from the middle of the live KV state: llama.cpp's
context shift, applied between turns.

Contract:
- `can_shift(llm)` is llama.cpp's own answer (`llama_memory_can_shift`): False
  for memories whose positions cannot move (recurrent models, a sliding-window
  cache kept at window size). `overflow_policy(requested, llm)` turns the
  `context_overflow` setting ("auto", "shift", "truncate") into the policy used
  and the reason shown on the model line.
- `shift(llm, keep, span)` removes tokens keep .. keep+span-1 of sequence 0 and
  moves every later token `span` positions back (`llama_memory_seq_rm` +
  `llama_memory_seq_add`; llama.cpp re-rotates the moved keys at the next
  decode), and keeps `input_ids` / `n_tokens` in step. The kept tokens' KV
  were computed with the removed ones in view: a reply after a shift can
  differ from a reply after a fresh prefill of the same prompt
  (docs/long-conversations.md has the measured rate). Returns False, with the
  context cleared, when the memory refuses; the caller prefills instead.
"""

from __future__ import annotations

import llama_cpp

from chatterm.core.engine.context_window import Overflow
from chatterm.core.engine.local import kv_state


def can_shift(llm: llama_cpp.Llama) -> bool:
    return bool(llama_cpp.llama_memory_can_shift(llama_cpp.llama_get_memory(llm.ctx)))


def overflow_policy(requested: str, llm: llama_cpp.Llama) -> tuple[Overflow, str]:
    """(the policy used, why) for the `context_overflow` setting `requested`."""
    if requested == Overflow.TRUNCATE:
        return Overflow.TRUNCATE, "set in models.toml"
    if can_shift(llm):
        return Overflow.SHIFT, "set in models.toml" if requested == Overflow.SHIFT else "the model's memory can shift"
    why = "this model's memory cannot shift positions (sliding-window or recurrent)"
    return Overflow.TRUNCATE, why if requested != Overflow.SHIFT else f"shift asked for, but {why}"


def shift(llm: llama_cpp.Llama, keep: int, span: int) -> bool:
    """Remove `span` tokens after the first `keep` from the context; see the contract."""
    n = llm.n_tokens
    if span <= 0 or keep < 0 or keep + span > n:
        return span == 0
    memory = llama_cpp.llama_get_memory(llm.ctx)
    if not llama_cpp.llama_memory_seq_rm(memory, 0, keep, keep + span):
        kv_state.clear(llm)
        return False
    llama_cpp.llama_memory_seq_add(memory, 0, keep + span, -1, -span)
    llm.input_ids[keep : n - span] = llm.input_ids[keep + span : n]
    llm.n_tokens = n - span
    llm._requires_eval = True  # the last logits belonged to the removed layout
    return True
