"""API-equivalent cost: reused prompt tokens at the cached price, new text (typed
ahead or not) at the input price."""

from __future__ import annotations

import json

import pytest

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.cost import apply_cost
from chatterm.core.metrics.format import footer_line
from chatterm.core.metrics.turn_metrics import TurnMetrics

PRICE = PriceProfile(id="p", input_per_m=2.0, cached_input_per_m=0.5, output_per_m=8.0, as_of="2026-01-01")


def turn(**values) -> TurnMetrics:
    return TurnMetrics(engine="local", model_id="m", persona_id="a", submitted_at=1.0, **values)


def test_tokens_prefilled_ahead_are_new_input_not_cached_input():
    m = turn(prompt_tokens=120, cached_tokens=100, ahead_tokens=40, prefilled_tokens=20, generated_tokens=10)
    apply_cost(m, PRICE)
    assert m.reused_tokens == 60
    assert m.cost_input_usd == pytest.approx(60 * 2.0e-6)  # 20 after Enter + 40 typed ahead
    assert m.cost_cached_input_usd == pytest.approx(60 * 0.5e-6)
    assert m.saved_usd == pytest.approx(60 * 1.5e-6)
    assert "(60 cached, 40 typed ahead)" in footer_line(m)


def test_without_type_ahead_every_cached_token_is_reused():
    m = turn(prompt_tokens=120, cached_tokens=100, prefilled_tokens=20)
    apply_cost(m, PRICE)
    assert m.reused_tokens == 100 and m.cost_cached_input_usd == pytest.approx(100 * 0.5e-6)
    assert "(100 cached)" in footer_line(m)


def test_a_turn_stopped_during_its_prefill_pays_for_what_it_went_through():
    # A new user's case: 3,825 prompt tokens, 171 reused, 32 typed ahead, Esc
    # before the first batch finished. It was charged for all 3,654 new tokens,
    # and the next turn, prefilling them, was charged again.
    stopped = turn(prompt_tokens=3825, cached_tokens=203, ahead_tokens=32, prefilled_tokens=0, stop_reason="cancelled")
    apply_cost(stopped, PRICE)
    assert stopped.unreached_tokens == 3622
    assert stopped.cost_input_usd == pytest.approx(32 * 2.0e-6)  # the typed-ahead tokens only
    part = turn(prompt_tokens=3825, cached_tokens=171, prefilled_tokens=512, stop_reason="cancelled")
    apply_cost(part, PRICE)
    assert part.cost_input_usd == pytest.approx(512 * 2.0e-6)
    # The breakdown ("where the money went") counts the same tokens.
    from chatterm.core.metrics.whatif import cost_split

    assert cost_split([stopped]).uncached_tokens == 32
    # A turn that failed mid-prefill likewise.
    failed = turn(prompt_tokens=3825, cached_tokens=171, prefilled_tokens=512, stop_reason="error")
    apply_cost(failed, PRICE)
    assert failed.cost_input_usd == pytest.approx(512 * 2.0e-6)
    # Stopped once the reply had begun, the whole prompt was computed.
    replying = turn(prompt_tokens=3825, cached_tokens=171, prefilled_tokens=3654, ttft_ms=900.0,
                    generated_tokens=3, stop_reason="cancelled")
    apply_cost(replying, PRICE)
    assert replying.unreached_tokens == 0 and replying.cost_input_usd == pytest.approx(3654 * 2.0e-6)


def test_a_catalog_without_a_default_model_names_the_key(tmp_path):
    from chatterm.core.config.catalog import load_catalog
    from chatterm.errors import ChattermError

    models = tmp_path / "models.toml"
    models.write_text(
        '[models.x]\nsource = "x.gguf"\nprice_profile = "p"\n'
        '[prices.p]\ninput = 1.0\noutput = 2.0\nas_of = "2026-01-01"\n'
    )
    catalog = load_catalog(models)
    assert catalog.get("x").id == "x"  # --model still works
    with pytest.raises(ChattermError, match=r"no default model: set \[defaults\] model"):
        catalog.get(None)


def test_remembering_a_theme_creates_the_config_folder(tmp_path):
    from chatterm.ui.settings import load_ui_settings, remember_theme

    path = tmp_path / "fresh" / "config" / "settings.toml"
    remember_theme(path, "chatterm-light")
    assert load_ui_settings(path).theme == "chatterm-light"


def test_dollar_amounts_carry_no_floating_point_noise():
    # 73 * 1.5 * 1e-6 is 0.00010949999999999999 in binary floating point.
    m = turn(prompt_tokens=90, cached_tokens=73, prefilled_tokens=17, generated_tokens=7)
    apply_cost(m, PRICE)
    assert repr(m.saved_usd) == "0.0001095"
    assert json.dumps(m.to_dict()["saved_usd"]) == "0.0001095"
    # The total is a sum of rounded parts: 0.1 + 0.2 is 0.30000000000000004.
    assert repr(turn(cost_input_usd=0.1, cost_cached_input_usd=0.2).cost_usd) == "0.3"


def test_stored_times_and_rates_are_rounded_to_a_microsecond_and_a_thousandth():
    m = turn(prefill_ms=161.1311270007718, ttft_ms=164.990012999624, decode_ms=152.93654999913997,
             generated_tokens=26, restore_ms=None)
    m.submitted_at = 1796655952.0651107
    data = m.to_dict()
    assert (data["prefill_ms"], data["ttft_ms"], data["decode_ms"]) == (161.131, 164.99, 152.937)
    assert data["decode_tok_s"] == 163.466 and data["restore_ms"] is None
    assert data["submitted_at"] == 1796655952.065111
    assert m.prefill_ms == 161.1311270007718  # the live figure keeps its precision


def test_a_stored_rate_is_the_one_its_stored_decode_time_gives():
    """Rounded apart, 356.9777614798519 ms over 238 tokens stored 356.978 ms
    beside 663.907 tok/s, which 237 / 0.356978 s does not give (663.906)."""
    m = turn(decode_ms=356.9777614798519, generated_tokens=238)
    data = m.to_dict()
    assert (data["decode_ms"], data["decode_tok_s"]) == (356.978, 663.906)
    assert TurnMetrics.from_dict(data).to_dict() == data
    short = turn(decode_ms=0.0004, generated_tokens=3).to_dict()  # rounds to no time: no rate
    assert (short["decode_ms"], short["decode_tok_s"]) == (0.0, None)


def write_user_models(isolated_dirs, text: str):
    config = isolated_dirs["CHATTERM_CONFIG_DIR"]
    config.mkdir(parents=True, exist_ok=True)
    (config / "models.toml").write_text(text)


def test_a_users_model_with_only_a_source_takes_the_default_price_profile(isolated_dirs, tmp_path):
    from chatterm.core.config.catalog import load_catalog

    write_user_models(isolated_dirs,
                      '[models.mine]\nsource = "mine.gguf"\n'
                      '[models.cheap-one]\nsource = "mine.gguf"\nprice_profile = "cheap"\n'
                      '[prices.cheap]\ninput = 0.1\noutput = 0.4\n')
    catalog = load_catalog()
    assert catalog.errors == []
    assert catalog.get("mine").price_profile == catalog.defaults.price_profile == "gpt-4.1"
    assert catalog.get("cheap-one").price_profile == "cheap"
    cheap = catalog.price("cheap")
    assert (cheap.label, cheap.as_of, cheap.cached_input_per_m) == ("cheap", "", 0.1)


def test_a_users_default_price_profile_applies_to_the_entries_without_one(isolated_dirs):
    from chatterm.core.config.catalog import load_catalog

    write_user_models(isolated_dirs,
                      '[defaults]\nprice_profile = "mine"\n[prices.mine]\ninput = 1\noutput = 2\n'
                      '[models.mine]\nsource = "mine.gguf"\n')
    catalog = load_catalog()
    assert catalog.get("mine").price_profile == "mine"
    assert catalog.get("smollm2-135m").price_profile == "gpt-4.1"  # it names its own


def test_without_any_default_price_profile_the_entry_is_skipped_with_one_line(tmp_path):
    from chatterm.core.config.catalog import load_catalog
    from chatterm.errors import ChattermError

    models = tmp_path / "models.toml"
    models.write_text('[defaults]\nmodel = "x"\n[models.x]\nsource = "x.gguf"\n'
                      '[models.y]\nsource = "y.gguf"\nprice_profile = "p"\n[prices.p]\ninput = 1\noutput = 2\n')
    catalog = load_catalog(models)
    assert catalog.get("y").price_profile == "p"
    assert catalog.errors == [f"{models}: [models.x] has no price_profile, and [defaults] names none"]
    with pytest.raises(ChattermError, match=r"\[models.x\] has no price_profile"):
        catalog.get("x")
    models.write_text('[defaults]\nmodel = "x"\nprice_profile = "gone"\n[models.x]\nsource = "x.gguf"\n')
    assert load_catalog(models).errors == [
        f"{models}: [models.x] its price_profile 'gone' (from [defaults]) is not defined"
    ]
