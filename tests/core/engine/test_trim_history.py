"""`trim_history`: the fewest dropped turns whose prompt fits, found in O(log n) renders."""

from __future__ import annotations

import math

from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from chatterm.core.engine.interface import ChatMessage, trim_history

PERSONA_SIZE = 7


def linear_rule(history, prompt_for, size, budget):
    """The rule trim_history must keep: drop one turn at a time from the front
    (the kept history never starts with an assistant reply) until it fits."""
    start, dropped = 0, 0
    prompt = prompt_for(history)
    while size(prompt) > budget and start < len(history):
        start += 1
        while start < len(history) and history[start].role != "user":
            start += 1
        dropped += 1
        prompt = prompt_for(history[start:])
    return prompt, dropped


class Renderer:
    """A prompt is (persona, kept messages); its size grows with every message."""

    def __init__(self):
        self.calls = 0

    def __call__(self, kept):
        self.calls += 1
        return ("persona", tuple(kept))

    @staticmethod
    def size(prompt) -> int:
        return PERSONA_SIZE + sum(1 + len(m.content) for m in prompt[1])


messages = st.lists(
    st.builds(ChatMessage, st.sampled_from(["user", "user", "assistant"]), st.text("ab", max_size=30)),
    max_size=300,
)


@fuzz(300)
@given(history=messages, budget=st.integers(0, 3000))
def test_same_result_as_dropping_one_turn_at_a_time_in_log_n_renders(history, budget):
    fast, linear = Renderer(), Renderer()
    assert trim_history(history, fast, Renderer.size, budget) == linear_rule(history, linear, Renderer.size, budget)
    turns = 1 + sum(1 for m in history[1:] if m.role == "user")  # boundaries after the first message
    assert fast.calls <= 2 + math.ceil(math.log2(turns + 1))


def test_a_long_overflowing_history_is_rendered_a_dozen_times_not_once_per_turn():
    history = []
    for i in range(2000):
        history += [ChatMessage("user", f"question {i} " * 5), ChatMessage("assistant", f"answer {i} " * 5)]
    render = Renderer()
    budget = Renderer.size(("persona", history[-20:]))  # the last 10 turns fit, no more
    prompt, dropped = trim_history(history, render, Renderer.size, budget)
    assert dropped == 1990 and prompt[1] == tuple(history[-20:])
    assert render.calls <= 14  # the linear rule renders 1,991 prompts here


def test_nothing_fits_drops_everything_and_a_fitting_history_is_rendered_once():
    history = [ChatMessage("assistant", "hello"), ChatMessage("user", "x" * 50), ChatMessage("assistant", "y")]
    render = Renderer()
    assert trim_history(history, render, Renderer.size, 0) == (("persona", ()), 2)
    render = Renderer()
    assert trim_history(history, render, Renderer.size, 10_000) == (("persona", tuple(history)), 0)
    assert render.calls == 1
