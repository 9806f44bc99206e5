"""Where a session's money goes, and what it would cost under every price profile.

Contract:
- `cost_split(turns)`: input (uncached / cached) against output, in tokens and
  in the dollars stored with each turn (the profile the session was priced at),
  with the input share of both. Uncached input = `TurnMetrics.uncached_tokens`
  (the prompt tokens a turn went through, less the reused ones), as in
  `chatterm.core.metrics.cost`; `switch_tokens` says how much of it was
  prefilled with the persona when it was loaded (in the context before
  Enter, but prefilled for that turn:
  `chatterm.core.metrics.format.input_breakdown` words it the same way).
- `what_if(turns, prices)`: the same turns priced with every profile given
  (normally `ModelCatalog.prices`: the bundled models.toml plus the user's, so a
  profile added there adds a column), through `chatterm.core.metrics.cost.apply_cost`, the
  one pricing rule (what the cache saved included). Each row also holds the cost
  without any cache: total + saved, every prompt token at the full input price. A profile without a
  cached-input discount saves nothing, and says so (`has_cache_discount`).
- Every turn counts, cancelled and failed ones too: their tokens were processed.
- Pure functions; profiles are read, never changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.cost import apply_cost
from chatterm.core.metrics.turn_metrics import CacheOutcome, TurnMetrics


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


@dataclass(frozen=True)
class CostSplit:
    uncached_tokens: int
    cached_tokens: int
    output_tokens: int
    uncached_usd: float
    cached_usd: float
    output_usd: float
    switch_tokens: int = 0
    """Of `uncached_tokens`: those prefilled with the persona when it was loaded
    (at launch or a switch), before the turn."""

    @property
    def input_tokens(self) -> int:
        return self.uncached_tokens + self.cached_tokens

    @property
    def input_usd(self) -> float:
        return self.uncached_usd + self.cached_usd

    @property
    def total_usd(self) -> float:
        return self.input_usd + self.output_usd

    @property
    def input_token_share(self) -> float | None:
        """Input tokens / all tokens (None for no tokens)."""
        return _share(self.input_tokens, self.input_tokens + self.output_tokens)

    @property
    def input_cost_share(self) -> float | None:
        """Input dollars / all dollars (None when nothing cost anything)."""
        return _share(self.input_usd, self.total_usd)


def switch_tokens(m: TurnMetrics) -> int:
    """The prompt tokens of `m` prefilled with the persona when it was loaded, just
    before it (at launch or a switch; 0 for other turns)."""
    if m.cache_outcome != CacheOutcome.SWITCH:
        return 0
    return max(m.cached_tokens - m.ahead_tokens, 0)


def cost_split(turns: Iterable[TurnMetrics]) -> CostSplit:
    turns = list(turns)
    return CostSplit(
        uncached_tokens=sum(m.uncached_tokens for m in turns),
        cached_tokens=sum(m.reused_tokens for m in turns),
        output_tokens=sum(m.generated_tokens for m in turns),
        uncached_usd=sum(m.cost_input_usd for m in turns),
        cached_usd=sum(m.cost_cached_input_usd for m in turns),
        output_usd=sum(m.cost_output_usd for m in turns),
        switch_tokens=sum(switch_tokens(m) for m in turns),
    )


@dataclass(frozen=True)
class WhatIf:
    profile: PriceProfile
    split: CostSplit
    """The session's tokens, priced with `profile`."""
    saved_usd: float
    """What the cached tokens would have cost more at the full input price."""

    @property
    def total_usd(self) -> float:
        return self.split.total_usd

    @property
    def without_cache_usd(self) -> float:
        """Every prompt token the turns went through at the full input price."""
        return self.total_usd + self.saved_usd

    @property
    def has_cache_discount(self) -> bool:
        return self.profile.cached_input_per_m < self.profile.input_per_m


def price_turns(turns: Iterable[TurnMetrics], profile: PriceProfile) -> WhatIf:
    priced = []
    for m in turns:
        copy = replace(m)
        apply_cost(copy, profile)
        priced.append(copy)
    return WhatIf(profile, cost_split(priced), sum(m.saved_usd for m in priced))


def what_if(turns: Iterable[TurnMetrics], prices: Mapping[str, PriceProfile]) -> list[WhatIf]:
    """One `WhatIf` per profile, in the catalog's order."""
    turns = list(turns)
    return [price_turns(turns, profile) for profile in prices.values()]


def priced_with(turns: Iterable[TurnMetrics]) -> list[str]:
    """The profile ids the stored costs were computed with (normally one)."""
    seen: dict[str, None] = {}
    for m in turns:
        if m.price_profile:
            seen.setdefault(m.price_profile, None)
    return list(seen)
