"""chatterm.core.metrics.format: the footer line and literal-safe text."""

import re
import time
from dataclasses import replace

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.cost import apply_cost
from chatterm.core.metrics.format import (
    ahead_line,
    fmt_ms,
    fmt_price,
    fmt_recent_time,
    fmt_usd,
    footer_line,
    input_breakdown,
    printable,
    usd_number,
)
from chatterm.core.metrics.turn_metrics import CacheOutcome, TurnMetrics
from chatterm.core.metrics.whatif import cost_split
from chatterm.core.report import words


def metrics(**kw) -> TurnMetrics:
    base = dict(engine="local", model_id="m", persona_id="p", submitted_at=0.0)
    base.update(kw)
    return TurnMetrics(**base)


def test_footer_line_matches_the_documented_shape():
    m = metrics(ttft_ms=142.4, generated_tokens=96, decode_ms=1983.0, prompt_tokens=1630,
                cached_tokens=1612, prefilled_tokens=18, cache_outcome="restored", restore_ms=41.2,
                cost_input_usd=0.0000360, cost_cached_input_usd=0.000806, cost_output_usd=0.002304,
                stop_reason="eos")
    assert footer_line(m) == (
        "TTFT 142 ms · 47.9 tok/s · 18 in (1,612 cached) · 96 out · $0.003146 · restored 41 ms"
    )


def test_a_restore_made_before_enter_says_so_beside_a_shorter_ttft():
    """"TTFT 124 ms · … · restored 134 ms" read as a restore longer than the wait
    for the first token: it was made while the message was typed."""
    m = metrics(ttft_ms=124.0, cache_outcome="restored", restore_ms=134.0, restore_at_switch=True)
    assert footer_line(m).endswith(" · restored 134 ms before Enter")


def test_footer_line_marks_stopped_estimated_and_missing_values():
    m = metrics(ttft_ms=None, generated_tokens=1, prefilled_tokens=5, cache_outcome="cold",
                prefill_ms=12_345.0, stop_reason="cancelled", tokens_estimated=True)
    line = footer_line(m)
    assert line.startswith("TTFT – · ~5 in · ~1 out · $0.000000 · cold prefill 12.3 s")
    assert line.endswith("· stopped") and "tok/s" not in line


def test_printable_makes_escapes_visible_and_inert():
    text = "a\x1b[31mred\x1b[0m\tb\nc\rd\x07\x9b2J"
    out = printable(text)
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\r" not in out
    assert out == "a␛[31mred␛[0m\tb\nc␍d␇\\x9b2J"
    assert printable("x\r\ny") == "x\ny"
    # Overrides and isolates reorder a line in a bidi-aware terminal; the marks
    # right-to-left text needs stay.
    assert printable("abc\u202edef\u2067g\u200fh") == "abc\ufffddef\ufffdg\u200fh"


def test_units():
    assert fmt_ms(9_999.4) == "9,999 ms" and fmt_ms(10_000) == "10.0 s" and fmt_ms(None) == "–"
    assert fmt_usd(0.00001234) == "$0.000012" and fmt_usd(None) == "–"
    # One amount, summed in two orders, lands either side of half a millionth:
    # both read the same (the dashboard said $0.003474 where F3 said $0.003475).
    costs = [n * 1e-7 for n in (4843, 9248, 8754)]  # 0.0022845 one way, 0.0022844999999999996 the other
    assert sum(costs) != sum(reversed(costs)) and f"{sum(costs):.6f}" != f"{sum(reversed(costs)):.6f}"
    assert fmt_usd(sum(costs)) == fmt_usd(sum(reversed(costs))) == "$0.002285"
    assert fmt_usd(0.00347449999999) == "$0.003475"


def test_a_prefix_prefilled_at_switch_time_is_not_called_this_turns_cold_prefill():
    m = metrics(ttft_ms=80.0, generated_tokens=3, prompt_tokens=67, cached_tokens=51,
                prefilled_tokens=16, cache_outcome="switch", prefill_ms=79.0, stop_reason="eos")
    line = footer_line(m)
    assert line.endswith("persona prefilled before the turn") and "cold prefill" not in line
    # Enter during that prefill: the label does not hide the wait.
    waited = footer_line(replace(m, wait_ms=19_100.0))
    assert waited.endswith("persona prefilled first, waited 19.1 s")


def test_a_turn_stopped_while_waiting_claims_no_prefill():
    m = metrics(ttft_ms=None, cache_outcome="none", wait_ms=3_000.0, stop_reason="cancelled",
                cache_detail="stopped while waiting for the engine to prepare persona 'shop-support'")
    assert footer_line(m) == "TTFT – · 0 in · 0 out · $0.000000 · stopped while waiting"
    assert TurnMetrics.from_dict(m.to_dict()).cache_outcome == "none"  # stored and read back as the enum


def test_dollars_have_one_precision_whatever_the_amount():
    # The panel that showed $0.000081 next to $0.0002: both to the millionth now.
    amounts = [0.000081, 0.0002, 0.0031459, 1.5, 1234.5, 0.0]
    shown = [fmt_usd(a) for a in amounts]
    assert shown == ["$0.000081", "$0.000200", "$0.003146", "$1.500000", "$1,234.500000", "$0.000000"]
    assert {len(text.split(".")[1]) for text in shown} == {6}
    # The reports use the same rule, without the sign (their titles say USD).
    assert [words.usd(a) for a in amounts] == [text.removeprefix("$") for text in shown]
    assert usd_number(0.000081) == "0.000081"


def test_a_non_zero_amount_too_small_to_show_is_never_a_zero():
    assert fmt_usd(0.0000003) == "<$0.000001" and words.usd(0.0000003) == "<0.000001"
    assert fmt_usd(0.0000004) == "<$0.000001" and fmt_usd(0.0000005) == "$0.000001"  # half goes up


def test_the_footer_and_the_reports_follow_the_rule():
    price = PriceProfile(id="p", input_per_m=2.0, cached_input_per_m=0.5, output_per_m=8.0)
    m = metrics(ttft_ms=90.0, prompt_tokens=67, cached_tokens=54, prefilled_tokens=13, generated_tokens=5,
                decode_ms=80.0, cache_outcome="restored", restore_ms=12.0, stop_reason="eos")
    apply_cost(m, price)
    assert re.findall(r"\$[\d,.]+", footer_line(m)) == ["$0.000093"]
    rows = words.split_rows(cost_split([m]))
    assert [row[2] for row in rows] == ["0.000026", "0.000027", "0.000040", "0.000093"]


def test_a_switch_turn_says_its_tokens_were_prefilled_with_the_persona_everywhere():
    # 67 prompt tokens, 54 of them the persona prefilled when it was loaded, for this
    # turn: billed as uncached input, so no wording may call them cached.
    price = PriceProfile(id="p", input_per_m=2.0, cached_input_per_m=0.5, output_per_m=8.0)
    m = metrics(ttft_ms=400.0, prompt_tokens=67, cached_tokens=54, prefilled_tokens=13, generated_tokens=3,
                cache_outcome="switch", wait_ms=300.0, stop_reason="eos")
    apply_cost(m, price)
    assert m.cost_input_usd == 67 * 2.0e-6 and m.cost_cached_input_usd == 0
    assert input_breakdown(m) == "54 prefilled with the persona"
    line = footer_line(m)
    assert "13 in (54 prefilled with the persona)" in line and "cached" not in line
    split = cost_split([m])
    assert (split.uncached_tokens, split.cached_tokens, split.switch_tokens) == (67, 0, 54)
    assert "includes 54 tokens prefilled with the persona" in words.split_sentence(split)
    # Typed ahead during such a turn: both are said.
    ahead = replace(m, cached_tokens=64, ahead_tokens=10, prefilled_tokens=3)
    assert input_breakdown(ahead) == "54 prefilled with the persona, 10 typed ahead"
    # After a model switch the history was prefilled again while typing: not typed ahead.
    rebuilt = replace(m, cache_outcome="memory", cached_tokens=1100, ahead_tokens=1046, ahead_history_tokens=1030)
    assert input_breakdown(rebuilt) == "54 cached, 1,030 history prefilled ahead, 16 typed ahead"
    assert ahead_line(rebuilt) == "16 + 1,030 history"
    assert ahead_line(replace(rebuilt, ahead_history_tokens=0)) == "1,046"
    # Any other turn's reused tokens are cached.
    assert input_breakdown(replace(m, cache_outcome="memory")) == "54 cached"


def test_a_persona_prefix_restore_names_the_tier_it_came_from():
    from chatterm.core.metrics.format import prefix_outcome_label

    # The picker says "cached in RAM"; the dashboard must not then say "from disk".
    assert prefix_outcome_label(CacheOutcome.RESTORED, 5.0, 2365, "ram") == "restored from RAM in 5 ms (2,365 tokens)"
    assert prefix_outcome_label(CacheOutcome.RESTORED, 31.0, 2365, "disk").startswith("restored from disk in 31 ms")
    assert prefix_outcome_label(CacheOutcome.COLD, 27_100.0, 2368).startswith("prefilled cold in 27.1 s")
    # Already in the context: nothing was done, so no "in 0 ms".
    assert prefix_outcome_label(CacheOutcome.MEMORY, 0.2, 54) == "already in memory (54 tokens)"


def test_recent_times_are_as_short_as_they_can_be_read():
    now = time.mktime((2026, 12, 7, 15, 30, 0, 0, 0, -1))
    at = lambda *ymdhm: time.mktime((*ymdhm, 0, 0, 0, -1))  # noqa: E731
    assert fmt_recent_time(at(2026, 12, 7, 9, 5), now) == "09:05"
    assert fmt_recent_time(at(2026, 12, 6, 23, 59), now) == "Dec 6 23:59"
    assert fmt_recent_time(at(2026, 1, 2, 8, 0), now) == "Jan 2 08:00"
    assert fmt_recent_time(at(2025, 12, 7, 9, 5), now) == "2025-12-07"


def test_a_price_per_million_reads_as_a_price_list_writes_it():
    assert [fmt_price(x) for x in (2, 0.075, 0.0125, 0.00001, 1234.5, 0, 1234567.891)] == [
        "$2.00", "$0.075", "$0.0125", "$0.00001", "$1,234.50", "$0.00", "$1,234,567.891"]
