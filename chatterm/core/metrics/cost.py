"""API-equivalent cost of a turn: what the same tokens would cost at a public API.

Prompt tokens reused from earlier prompts (`TurnMetrics.reused_tokens`) are
charged at the cached input price, the rest of the prompt (type-ahead tokens
included: they are new text) at the input price, generated tokens at the output
price (`TurnMetrics.uncached_tokens`); a turn stopped or failed during its
prefill pays only for the tokens it got through (`unreached_tokens` are the
next turn's). "Saved" is what the reused tokens would have cost at the full input
price, minus what they did cost.

Dollar amounts go through `metrics.usd` (no floating point noise in the stored
turns or the exports).
"""

from __future__ import annotations

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.turn_metrics import TurnMetrics, usd

PER_TOKEN = 1e-6  # prices are per 1M tokens


def apply_cost(metrics: TurnMetrics, price: PriceProfile) -> None:
    """Fill the cost fields of `metrics` from its token counts."""
    reused = metrics.reused_tokens
    uncached = metrics.uncached_tokens
    metrics.price_profile = price.id
    metrics.cost_input_usd = usd(uncached * price.input_per_m * PER_TOKEN)
    metrics.cost_cached_input_usd = usd(reused * price.cached_input_per_m * PER_TOKEN)
    metrics.cost_output_usd = usd(metrics.generated_tokens * price.output_per_m * PER_TOKEN)
    metrics.saved_usd = usd(reused * (price.input_per_m - price.cached_input_per_m) * PER_TOKEN)


def energy_cost_usd(energy_wh: float, usd_per_kwh: float) -> float:
    return usd(energy_wh / 1000.0 * usd_per_kwh)
