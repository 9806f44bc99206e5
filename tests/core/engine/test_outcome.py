"""A local turn's cache outcome and its "saved" prefill time, from what it started
from: pure functions, no model (the engine tests check them on real turns)."""

from __future__ import annotations

import pytest

from chatterm.core.cache.prompt_cache import Slot
from chatterm.core.engine.interface import PrefixReport
from chatterm.core.engine.local.outcome import (
    MIN_REUSE,
    Outcome,
    PrefillRate,
    PreparedPersona,
    Reuse,
    classify,
    saved_prefill_ms,
    started_from,
)
from chatterm.core.metrics.turn_metrics import CacheOutcome

PERSONA = "fingerprint-of-shop-support"
PREFIX = 120


def prepared(outcome: CacheOutcome, ms: float = 40.0, fingerprint: str = PERSONA) -> PreparedPersona:
    return PreparedPersona(fingerprint, PrefixReport(outcome, ms, PREFIX))


@pytest.mark.parametrize(
    "reuse, expected",
    [
        (Reuse("ram", 300, Slot.session(3), ms=12.5), Outcome(CacheOutcome.RESTORED, 12.5)),
        (Reuse("disk", 120, Slot.persona("p"), ms=30.0), Outcome(CacheOutcome.RESTORED, 30.0)),
        (Reuse("live", MIN_REUSE), Outcome(CacheOutcome.MEMORY)),
        (Reuse("live", MIN_REUSE - 1), Outcome(CacheOutcome.COLD)),
        (Reuse("", 0), Outcome(CacheOutcome.COLD)),
    ],
)
def test_without_a_prepared_persona_the_outcome_is_where_the_tokens_came_from(reuse, expected):
    assert classify(reuse, None, PERSONA) == expected


def test_a_prefix_restored_at_the_switch_is_reported_as_that_restore():
    assert classify(Reuse("live", PREFIX), prepared(CacheOutcome.RESTORED, 40.0), PERSONA) == Outcome(
        CacheOutcome.RESTORED, 40.0, restore_at_switch=True
    )


def test_a_prefix_prefilled_cold_at_the_switch_is_a_switch_not_memory():
    assert classify(Reuse("live", PREFIX), prepared(CacheOutcome.COLD), PERSONA) == Outcome(CacheOutcome.SWITCH)
    # The message typed ahead after it does not make it a reuse from memory
    # (that claimed the whole prefill as "saved" after a cold switch).
    typed = Reuse("live", PREFIX + 30)
    assert classify(typed, prepared(CacheOutcome.COLD), PERSONA, ahead=30) == Outcome(CacheOutcome.SWITCH)
    assert classify(typed, prepared(CacheOutcome.RESTORED, 40.0), PERSONA, ahead=30) == Outcome(
        CacheOutcome.RESTORED, 40.0, restore_at_switch=True)


@pytest.mark.parametrize(
    "reuse, report, why",
    [
        (Reuse("live", PREFIX), prepared(CacheOutcome.COLD, fingerprint="another persona"), "another persona"),
        (Reuse("live", PREFIX + 1), prepared(CacheOutcome.COLD), "the live context holds more than the prefix"),
        (Reuse("live", PREFIX), prepared(CacheOutcome.MEMORY), "the prefix was in memory at the switch too"),
    ],
)
def test_the_switch_report_counts_only_for_its_own_prefix(reuse, report, why):
    assert classify(reuse, report, PERSONA) == Outcome(CacheOutcome.MEMORY), why


def test_a_restore_by_the_turn_itself_outranks_the_switch_report():
    reuse = Reuse("disk", 300, Slot.session(3), ms=25.0)
    assert classify(reuse, prepared(CacheOutcome.RESTORED, 40.0), PERSONA) == Outcome(CacheOutcome.RESTORED, 25.0)


@pytest.mark.parametrize(
    "reuse, label",
    [
        (Reuse("ram", 1234, Slot.session(3)),
         "reused 1,234 of 1,300 tokens (conversation, session 3, restored from RAM)"),
        (Reuse("disk", 120, Slot.persona("p")), "reused 120 of 1,300 tokens (persona prefix, restored from disk)"),
        (Reuse("live", 1000), "reused 1,000 of 1,300 tokens (live context)"),
        (Reuse("live", 800, shifted=400), "reused 800 of 1,300 tokens (live context, 400 oldest tokens shifted out)"),
        (Reuse("disk", 28, Slot.session(3)),  # a long prompt that only its persona matched: no hit
         "reused 28 of 1,300 tokens (conversation, session 3, restored from disk)"),
        (Reuse("live", MIN_REUSE - 1), "nothing reused"),
        (Reuse("", 0), "nothing reused"),
    ],
)
def test_labels_say_what_share_was_reused(reuse, label):
    assert reuse.label(1300) == label


def test_saved_is_the_reused_tokens_at_the_rate_less_the_wait_and_the_restore():
    assert saved_prefill_ms(1000, 0.5, 30.0, 20.0, False) == pytest.approx(450.0)


def test_a_restore_at_the_switch_that_the_turn_waited_for_is_counted_once():
    assert saved_prefill_ms(1000, 0.5, 30.0, 20.0, True) == pytest.approx(470.0)  # restore done before the send
    assert saved_prefill_ms(1000, 0.5, 30.0, 45.0, True) == pytest.approx(455.0)  # waited for it: in wait_ms


@pytest.mark.parametrize(
    "reused, rate, restore, wait",
    [
        (1000, None, None, 0.0),  # no rate known yet
        (MIN_REUSE - 1, 0.5, None, 0.0),  # a handful is not reuse
        (100, 0.5, 30.0, 40.0),  # spent more than it saved: never negative
    ],
)
def test_nothing_is_saved_without_a_rate_a_real_reuse_or_a_gain(reused, rate, restore, wait):
    assert saved_prefill_ms(reused, rate, restore, wait, False) == 0.0


def test_the_prefill_rate_is_the_fastest_known_from_long_enough_prefills_and_stored_rates():
    rate = PrefillRate()
    rate.measured(1000.0, MIN_REUSE - 1)  # too short to count
    rate.measured(50.0, 0)
    assert rate.ms_per_token is None
    rate.measured(400.0, 100)
    assert rate.ms_per_token == 4.0
    rate.measured(1000.0, 100)  # slower, measured on a busy machine: not adopted
    rate.adopt(True)
    rate.adopt("2.0")
    rate.adopt(-1.0)
    assert rate.ms_per_token == 4.0
    rate.adopt(2.5)  # a restored state's, faster
    assert rate.ms_per_token == 2.5


def test_a_turn_that_goes_on_from_what_type_ahead_restored_reports_that_restore():
    ahead = Reuse("disk", 900, Slot.session(4), ms=35.0, misses=["persona x (disk): evicted"], ahead=True)
    # The turn found the restored conversation and the message typed after it live.
    started = started_from(Reuse("live", 940), ahead)
    assert (started.source, started.tokens, started.ms) == ("disk", 940, 35.0)
    assert classify(started, prepared(CacheOutcome.RESTORED), PERSONA) == Outcome(
        CacheOutcome.RESTORED, 35.0, restore_at_switch=True)
    assert started.label(941) == ("reused 940 of 941 tokens (conversation, session 4, "
                                  "restored from disk before the message was sent)")
    assert started.misses == ["persona x (disk): evicted"]
    # A turn that started elsewhere (the context was replaced, or trimmed below
    # the restored state) reports what it did itself.
    for own in (Reuse("ram", 950, Slot.session(5), ms=9.0), Reuse("live", 300)):
        assert started_from(own, ahead) is own
    assert started_from(Reuse("live", 940), None).source == "live"
