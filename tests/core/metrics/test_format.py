"""chatterm.core.metrics.format: the footer line and literal-safe text."""

from dataclasses import replace

from chatterm.core.metrics.format import fmt_ms, fmt_usd, footer_line, printable
from chatterm.core.metrics.turn_metrics import TurnMetrics


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
        "TTFT 142 ms · 47.9 tok/s · 18 in (1,612 cached) · 96 out · $0.0031 · restored 41 ms"
    )


def test_footer_line_marks_stopped_estimated_and_missing_values():
    m = metrics(ttft_ms=None, generated_tokens=1, prefilled_tokens=5, cache_outcome="cold",
                prefill_ms=12_345.0, stop_reason="cancelled", tokens_estimated=True)
    line = footer_line(m)
    assert line.startswith("TTFT – · ~5 in · ~1 out · $0 · cold prefill 12.3 s")
    assert line.endswith("· stopped") and "tok/s" not in line


def test_printable_makes_escapes_visible_and_inert():
    text = "a\x1b[31mred\x1b[0m\tb\nc\rd\x07\x9b2J"
    out = printable(text)
    assert "\x1b" not in out and "\x07" not in out and "\x9b" not in out and "\r" not in out
    assert out == "a␛[31mred␛[0m\tb\nc␍d␇\\x9b2J"
    assert printable("x\r\ny") == "x\ny"


def test_units():
    assert fmt_ms(9_999.4) == "9,999 ms" and fmt_ms(10_000) == "10.0 s" and fmt_ms(None) == "–"
    assert fmt_usd(0.00001234) == "$0.000012" and fmt_usd(1.5) == "$1.50" and fmt_usd(0) == "$0"


def test_a_prefix_prefilled_at_switch_time_is_not_called_this_turns_cold_prefill():
    m = metrics(ttft_ms=80.0, generated_tokens=3, prompt_tokens=67, cached_tokens=51,
                prefilled_tokens=16, cache_outcome="switch", prefill_ms=79.0, stop_reason="eos")
    line = footer_line(m)
    assert line.endswith("persona prefilled before the turn") and "cold prefill" not in line
    # Enter during that prefill: the label does not hide the wait.
    waited = footer_line(replace(m, wait_ms=19_100.0))
    assert waited.endswith("persona prefilled at the switch, waited 19.1 s")


def test_a_turn_stopped_while_waiting_claims_no_prefill():
    m = metrics(ttft_ms=None, cache_outcome="none", wait_ms=3_000.0, stop_reason="cancelled",
                cache_detail="stopped while waiting for the engine to prepare persona 'shop-support'")
    assert footer_line(m) == "TTFT – · 0 in · 0 out · $0 · stopped while waiting"
    assert TurnMetrics.from_dict(m.to_dict()).cache_outcome == "none"  # stored and read back as the enum
