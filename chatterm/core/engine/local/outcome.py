"""What a local turn started from, what its cache outcome is called, and what
its reuse saved: plain data and pure functions, so the labels and the
arithmetic hold without a model.

Contract:
- `Reuse` is what a turn (or a persona prepare) started from: the live
  context, a state restored from the prompt cache's RAM or disk tier, or
  nothing, and what a context shift removed from it; `label(prompt_tokens)`
  says so in the words of `TurnMetrics.cache_detail`, the share reused first.
- `PreparedPersona` is a persona prefix that `prepare_persona` made ready and
  no turn has used yet.
- `started_from(reuse, restored_ahead)` is what a turn reports it started
  from: the state type-ahead restored, when the turn went on from it.
- `classify(reuse, prepared, fingerprint, ahead)` names the outcome: RESTORED (from
  RAM or disk, by this turn, or before it was sent: at the persona switch, or
  by type-ahead while the message was typed, which `restore_at_switch` tells
  apart), SWITCH (the live context holds the
  persona prefix prefilled cold at the switch for this turn), MEMORY (at least
  MIN_REUSE tokens of the live context), else COLD.
- `saved_prefill_ms(...)` is the prefill time the reuse saved: the reused
  tokens at the fastest prefill rate known, net of what the turn spent getting
  them; 0 when no rate is known or fewer than MIN_REUSE tokens were reused.
- `PrefillRate` is that fastest rate: the fastest of the prefills of at
  least MIN_REUSE tokens measured (`measured`) and of the rates stored with
  the states restored (`adopt`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from chatterm.core.cache.prompt_cache import Slot
from chatterm.core.engine.interface import PrefixReport
from chatterm.core.metrics.turn_metrics import CacheOutcome

MIN_REUSE = 8
"""Fewer reused tokens than this is not called a reuse (a template's own few
opening tokens are "a handful"), and a cached state must share this many more
tokens than the live context to be restored: a restore replaces the whole
context, which costs more than prefilling a handful of tokens."""


@dataclass
class Reuse:
    """What a turn (or a persona prepare) started from."""

    source: str
    """"live", "ram", "disk", or "" (nothing)."""
    tokens: int
    """Tokens of the target now in the context."""
    slot: Slot | None = None
    ms: float = 0.0
    """Lookup + restore + trim time (0 for the live context)."""
    misses: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    shifted: int = 0
    """Tokens of the oldest turns removed from the state (context shift)."""
    shift_ms: float = 0.0
    ahead: bool = False
    """Restored by type-ahead, before the turn was sent."""
    saved_by: str = ""
    """The model id whose state it was, when not this model's: another catalog
    entry for the same file and KV settings (`PromptCache.lookup`)."""

    @property
    def restored(self) -> bool:
        return self.source in ("ram", "disk")

    def label(self, prompt_tokens: int) -> str:
        """"reused 28 of 714 tokens (...)": the share first, so a restore that
        gave only the persona of a long prompt does not read like a hit."""
        share = f"reused {self.tokens:,} of {prompt_tokens:,} tokens"
        shifted = f", {self.shifted:,} oldest tokens shifted out" if self.shifted else ""
        tier = "RAM" if self.source == "ram" else self.source
        source = f"restored from {tier}" + (" before the message was sent" if self.ahead else "")
        if self.saved_by:
            source += f", saved by {self.saved_by}"
        if self.restored and self.slot is not None and self.slot.kind == "session":
            return f"{share} (conversation, session {self.slot.session_id}, {source}{shifted})"
        if self.restored:
            return f"{share} (persona prefix, {source})"
        if self.source == "live" and self.tokens >= MIN_REUSE:
            return f"{share} (live context{shifted})"
        return "nothing reused"


def switch_label(in_context: int, prompt_tokens: int, typed_ahead: int) -> str:
    """The cache note of a SWITCH turn: its `in_context` tokens were prefilled
    for it before it was sent (the persona's prompt, and `typed_ahead` of them
    while the message was typed), so nothing is reused. Worded so beside
    `cached_tokens` (the same count) it does not read as "nothing in the
    context": "nothing reused: 54 of 67 tokens prefilled" did."""
    typed = f" ({typed_ahead:,} of them typed ahead)" if typed_ahead else ""
    return (f"prefilled for this turn before it was sent, with the persona: {in_context:,} of "
            f"{prompt_tokens:,} tokens{typed}; none reused from a cache")


class PreparedPersona(NamedTuple):
    """A persona prefix made ready by `prepare_persona`, not yet used by a turn."""

    fingerprint: str
    """`Persona.fingerprint` of the persona prepared."""
    report: PrefixReport
    """How its prefix was made ready."""


@dataclass(frozen=True)
class Outcome:
    label: CacheOutcome
    restore_ms: float | None = None
    """The restore's time, when a state was restored (by the turn or at the switch)."""
    restore_at_switch: bool = False
    """The restore happened at the persona switch, before the turn was sent."""


def started_from(reuse: Reuse, restored_ahead: Reuse | None) -> Reuse:
    """What a turn started from: `reuse`, or, when the turn went on in the live
    context from the state type-ahead restored while the message was typed,
    that restore (with the tokens the turn reused)."""
    if restored_ahead is None or reuse.source != "live" or reuse.tokens < restored_ahead.tokens:
        return reuse
    return replace(restored_ahead, tokens=reuse.tokens, misses=[*restored_ahead.misses, *reuse.misses],
                   shifted=reuse.shifted, shift_ms=reuse.shift_ms)


def classify(reuse: Reuse, prepared: PreparedPersona | None, fingerprint: str, ahead: int = 0) -> Outcome:
    """The cache outcome of a turn of the persona `fingerprint` that started from
    `reuse`, `ahead` of whose tokens were prefilled while the message was typed."""
    if (prepared is not None and prepared.fingerprint == fingerprint and reuse.source == "live"
            and reuse.tokens - ahead <= prepared.report.tokens):
        # The live context is the prefix made ready at the switch: report how it
        # was made ready, not "memory".
        if prepared.report.outcome == CacheOutcome.RESTORED:
            return Outcome(CacheOutcome.RESTORED, prepared.report.ms, restore_at_switch=True)
        if prepared.report.outcome == CacheOutcome.COLD:
            return Outcome(CacheOutcome.SWITCH)
    if reuse.restored:
        return Outcome(CacheOutcome.RESTORED, reuse.ms, restore_at_switch=reuse.ahead)
    if reuse.tokens >= MIN_REUSE:
        return Outcome(CacheOutcome.MEMORY)
    return Outcome(CacheOutcome.COLD)


def saved_prefill_ms(
    reused_tokens: int,
    ms_per_token: float | None,
    restore_ms: float | None,
    wait_ms: float,
    restore_at_switch: bool,
) -> float:
    """Prefill time saved by reusing `reused_tokens` (`TurnMetrics.reused_tokens`).

    The reused tokens at `ms_per_token` (the fastest rate known), less what
    the turn spent getting them: its restore and the time it waited (for a
    persona prepare or a type-ahead batch). A restore at the switch was either
    waited for (it is inside `wait_ms`) or done before the turn was sent, so it
    is counted once. Tokens prefilled ahead and a persona prefilled cold at the
    switch are not in `reused_tokens`: they were new work, not reuse."""
    if not ms_per_token or reused_tokens < MIN_REUSE:
        return 0.0
    restore = restore_ms or 0.0
    spent = max(wait_ms, restore) if restore_at_switch else wait_ms + restore
    return max(reused_tokens * ms_per_token - spent, 0.0)


class PrefillRate:
    """The fastest prefill rate known, in ms per token (None: none yet). The
    fastest, not the latest: one measured while another process kept the CPU
    busy must not inflate the "saved" estimates. A prefill this short
    overstates the cost per token, but a first use of a short persona must
    still give an estimate."""

    MIN_TOKENS = MIN_REUSE

    def __init__(self) -> None:
        self.ms_per_token: float | None = None

    def measured(self, ms: float, tokens: int) -> None:
        """A prefill of `tokens` took `ms`."""
        if tokens >= self.MIN_TOKENS and ms > 0:
            self.adopt(ms / tokens)

    def adopt(self, rate: Any) -> None:
        """A rate from elsewhere (a restored state's `prefill_ms_per_token`,
        which gives a fresh process an estimate before it has prefilled
        anything long); anything but a positive number is ignored."""
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
            known = self.ms_per_token
            self.ms_per_token = float(rate) if known is None else min(known, float(rate))
