"""The overflow rules without a model: the sticky cut and the span a shift removes."""

from __future__ import annotations

from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.engine.context_window import choose_cut, shift_span, turn_starts

FIXED, BUDGET, KEEP = 50, 1000, 0.5
turns = st.lists(st.integers(1, 300), min_size=0, max_size=60)


def prompt_size(sizes, user, cut):
    return FIXED + sum(sizes[cut:]) + user


def replay(sizes, users, keep_newest=False):
    """The cut of each turn of a conversation, each anchored at the one before."""
    cuts, anchor = [], 0
    for j in range(len(sizes) + 1):
        anchor += choose_cut(sizes[anchor:j], users[j], FIXED, BUDGET, KEEP, keep_newest)
        cuts.append(anchor)
    return cuts


@fuzz(300)
@given(turns, st.data(), st.booleans())
def test_the_cut_fits_and_only_moves_forward(sizes, data, keep_newest):
    users = data.draw(st.lists(st.integers(1, 100), min_size=len(sizes) + 1, max_size=len(sizes) + 1))
    cuts = replay(sizes, users, keep_newest)
    assert cuts == sorted(cuts)  # a turn once left out stays out
    for j, cut in enumerate(cuts):
        assert cut <= j
        if prompt_size(sizes[:j], users[j], cut) > BUDGET:
            assert cut == j  # only when the message alone leaves no room for a turn
        if j and cut != cuts[j - 1]:
            # A move frees room for later turns: the prompt drops to the low mark
            # (or as far as whole turns allow; under shift, the newest turn stays).
            assert prompt_size(sizes[:j], users[j], cut) <= BUDGET * KEEP or cut >= j - keep_newest
        if keep_newest and j and prompt_size(sizes[:j], users[j], j - 1) <= BUDGET:
            assert cut <= j - 1  # the newest turn stays while it fits


def test_the_cut_stays_put_until_the_context_fills_again():
    sizes, users = [200] * 12, [20] * 13
    # Fits through 4 turns (50 + 800 + 20); the fewest-dropped rule would move
    # the cut on every turn from turn 5 on.
    # Cut to <= 500 tokens (3 of the 5 turns out), so the next two turns fit as they are.
    assert replay(sizes, users) == [0, 0, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9, 9]


def test_a_prompt_that_fits_is_not_cut_and_one_that_does_not_is_cut_deep():
    assert choose_cut([200] * 4, 20, FIXED, BUDGET, KEEP) == 0
    # 50 + 1000 + 20 does not fit: cut until <= 500 (turns 3 and 4 kept: 470).
    assert choose_cut([200] * 5, 20, FIXED, BUDGET, KEEP) == 3
    # A message that alone leaves no room: every turn is left out.
    assert choose_cut([200] * 2, 900, FIXED, BUDGET, KEEP) == 2
    # Under shift, the newest turn, larger than the low mark, stays while it fits.
    assert choose_cut([500, 600], 20, FIXED, BUDGET, KEEP, keep_newest=True) == 1
    assert choose_cut([500, 600], 400, FIXED, BUDGET, KEEP, keep_newest=True) == 2
    assert choose_cut([500, 600], 20, FIXED, BUDGET, KEEP) == 2  # truncate: cut deep, the cut holds longer


def test_turn_starts_never_begin_with_a_reply():
    assert turn_starts([]) == []
    assert turn_starts(["user", "assistant", "user", "assistant", "user"]) == [0, 2, 4]
    assert turn_starts(["assistant", "user", "assistant"]) == [0, 1]


def test_shift_span_removes_the_dropped_turns():
    persona, t1, t2, t3 = [1, 2, 3], [9, 10, 11], [9, 20, 21], [9, 30, 31]
    live = persona + t1 + t2 + t3
    target = persona + t2 + t3 + [9, 40]
    assert shift_span(live, target, len(persona)) == (len(t1), len(persona + t2 + t3))


def test_shift_span_takes_a_partial_match_when_the_last_reply_differs():
    persona = [1, 2]
    live = persona + [9, 5, 5] + [9, 6, 6, 7]
    target = persona + [9, 6, 6, 8, 8]
    assert shift_span(live, target, len(persona)) == (3, len(persona) + 3)


def test_shift_span_none_when_nothing_is_gained():
    persona = [1, 2]
    assert shift_span(persona + [9, 5], persona + [9, 5, 6], 2) is None  # already a prefix
    assert shift_span([7, 2, 9, 5], persona + [9, 5], 2) is None  # the persona differs
    assert shift_span(persona + [9, 5], persona + [8], 2) is None  # nothing matches after it
    assert shift_span(persona, persona + [9], 2) is None  # nothing to remove


@fuzz(300)
@given(st.lists(st.integers(0, 3), max_size=80), st.lists(st.integers(0, 3), max_size=80), st.integers(1, 5))
def test_shift_span_result_is_what_it_says(live, target, keep):
    found = shift_span(live, target, keep)
    if found is None:
        return
    span, shared = found
    shifted = live[:keep] + live[keep + span:]
    assert span >= 1
    assert shifted[:shared] == target[:shared]
    assert shared > common_prefix_len(live, target)
