"""Per-turn and per-session latency metrics.

Contract:
- `TurnMetrics` is the one record of a turn. Engines fill it while a reply
  streams (the UI may read it at any time), the store persists it, the export
  writes it. `TurnMetrics.to_dict()` gives the stable, documented field names
  (units in the names) used by the database, JSONL/CSV/Markdown export and
  `chatterm ask --json`.
- Times are milliseconds measured with `time.perf_counter`, except
  `submitted_at` (Unix seconds, wall clock).
- decode tokens/s = (K - 1) / (t_K - t_first): the first token's time belongs to
  TTFT, so a one-token reply has no decode rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Iterable


class CacheOutcome(StrEnum):
    """Where a turn's prompt prefix came from (stored and exported by value)."""

    RESTORED = "restored"
    """A persona prefix or a conversation was loaded from the prompt cache (by
    this turn, or before it was sent: at the persona switch, or by type-ahead
    while the message was typed; `restore_ms` says how long, `restore_at_switch`
    which)."""
    MEMORY = "memory"
    """The prefix (and maybe history) was already in the context."""
    COLD = "cold"
    """This turn prefilled the persona prefix itself (then saved it to disk)."""
    SWITCH = "switch"
    """The persona prefix was prefilled when the persona was switched to, before
    this turn was started. It is in the context (`cached_tokens`), but it was
    computed for this turn, not reused from an earlier one: nothing is
    `reused_tokens`, so it is charged at the input price and nothing is
    "saved" (as an API charges the first request that writes its prompt cache).
    The part of that prefill the turn waited for is in `wait_ms`."""
    SERVER = "server"
    """A remote server did (or did not) reuse its own prefix cache."""
    NONE = "none"
    """The turn was stopped while it waited for the engine (a persona being
    prepared): nothing was reused or prefilled, so there was no outcome."""


class StopReason(StrEnum):
    """Why a reply ended (stored and exported by value)."""

    EOS = "eos"
    LENGTH = "length"
    CONTEXT = "context"
    """The context filled up before the reply ended (below max_tokens)."""
    CANCELLED = "cancelled"
    ERROR = "error"


def _enum_or_text(enum: type[StrEnum], value: object) -> object:
    """A stored value as its enum member; unknown text (a newer chatterm) stays text.
    (A dict lookup, not `enum(value)`: this runs for every turn an export reads.)"""
    return enum._value2member_map_.get(value, value)


@dataclass
class TurnMetrics:
    engine: str
    """"local" (llama.cpp in process) or "openai" (remote server)."""
    model_id: str
    persona_id: str
    submitted_at: float
    """Unix time (s) the user submitted the message."""
    price_profile: str = ""
    cache_outcome: CacheOutcome | str = CacheOutcome.COLD
    cache_detail: str = ""
    """Why: e.g. "state file rejected: model sha256 differs"."""
    wait_ms: float = 0.0
    """Submit until the engine could start this turn (it was still preparing the
    persona, or finishing a type-ahead batch): the first part of TTFT."""
    restore_ms: float | None = None
    """Time to read and load the persona state file, when one was restored."""
    restore_at_switch: bool = False
    """`restore_ms` was spent before this turn was sent, when the persona was
    switched to or while the message was typed (type-ahead restored the
    conversation; `cache_detail` says which): it is not part of the turn's TTFT."""
    prefill_ms: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Prompt tokens reused from the KV cache (not prefilled this turn)."""
    prefilled_tokens: int = 0
    ahead_tokens: int = 0
    """Prompt tokens prefilled ahead, while the message was being typed: counted
    in `cached_tokens` (this turn reused them), their time is `ahead_ms`."""
    ahead_ms: float = 0.0
    """Time spent prefilling `ahead_tokens` before Enter; not part of TTFT."""
    ahead_history_tokens: int = 0
    """Of `ahead_tokens`, those of the conversation before the message: after a
    model switch, a fork or a cache that could not be restored, the history is
    prefilled again while the next message is typed."""
    generated_tokens: int = 0
    seed: int | None = None
    """The sampling seed of the reply; None when it was greedy (temperature 0).
    Pinned in the persona (`seed`), with the same model and prompt, it samples
    the same reply again."""
    ttft_ms: float | None = None
    """Submit to first token available."""
    decode_ms: float = 0.0
    """First token to last token."""
    total_ms: float = 0.0
    stop_reason: StopReason | str = ""
    """A `StopReason`; "" while the reply is still streaming."""
    error: str | None = None
    dropped_turns: int = 0
    """Oldest history turns the prompt left out so it fits the context."""
    cut_turns: int = 0
    """Of `dropped_turns`, those left out at this turn (the cut moved); 0 while
    the cut holds, so a long conversation's turns reuse their cache."""
    shifted_tokens: int = 0
    """Tokens of those turns removed from the KV state by a context shift (the
    kept turns were not prefilled again)."""
    shift_ms: float = 0.0
    """Time the shift took: part of the turn's TTFT."""
    tokens_estimated: bool = False
    """True when a server reported no usage and counts were estimated."""
    cost_input_usd: float = 0.0
    cost_cached_input_usd: float = 0.0
    cost_output_usd: float = 0.0
    saved_prefill_ms: float = 0.0
    """Estimated prefill time the reused tokens would have taken (at the fastest
    prefill rate known), net of what the turn spent getting them: the restore
    and the time it waited (`wait_ms`: a persona prefill the user waited for
    was not saved)."""
    saved_usd: float = 0.0
    """Input cost avoided: cached tokens at the cached price instead of the full one."""
    energy_wh: float | None = None
    """GPU energy for the turn, where the GPU reports power."""
    energy_cost_usd: float | None = None

    @property
    def decode_tok_s(self) -> float | None:
        return decode_rate(self.generated_tokens, self.decode_ms)

    @property
    def typed_ahead_tokens(self) -> int:
        """Of `ahead_tokens`, those of the message itself (the rest are
        `ahead_history_tokens`, the conversation prefilled again)."""
        return self.ahead_tokens - min(self.ahead_history_tokens, self.ahead_tokens)

    @property
    def reused_tokens(self) -> int:
        """Prompt tokens reused from earlier prompts (persona prefix, conversation):
        what an API's prompt cache would serve. `ahead_tokens` are in
        `cached_tokens` too, but they are this turn's own new text, prefilled
        early: an API would charge them as uncached input."""
        if self.cache_outcome == CacheOutcome.SWITCH:
            return 0  # prefilled with the persona for this very turn: new work, not reuse
        return max(self.cached_tokens - self.ahead_tokens, 0)

    @property
    def unreached_tokens(self) -> int:
        """Prompt tokens the turn never prefilled: stopped (or failed) during its
        prefill, it went through `cached_tokens + prefilled_tokens` of them. Not
        input it computed, so not charged (the next turn prefills them, and pays)."""
        if self.stop_reason not in (StopReason.CANCELLED, StopReason.ERROR) or self.ttft_ms is not None:
            return 0
        return max(self.prompt_tokens - self.cached_tokens - self.prefilled_tokens, 0)

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens charged at the input price: those the turn went through,
        less the reused ones (type-ahead tokens included: they are new text)."""
        return max(self.prompt_tokens - self.reused_tokens - self.unreached_tokens, 0)

    @property
    def early_tokens(self) -> int:
        """Prompt tokens prefilled for this turn before it was sent (typed ahead,
        its history prefilled ahead, or with the persona when it was loaded): in
        `cached_tokens`, not in `reused_tokens`."""
        return max(self.cached_tokens - self.reused_tokens, 0)

    @property
    def cost_usd(self) -> float:
        return usd(self.cost_input_usd + self.cost_cached_input_usd + self.cost_output_usd)

    def to_dict(self) -> dict:
        """Stable field names for storage and export (derived fields included)."""
        # Every field is a plain scalar: a copy of the instance dict (fields in
        # declaration order) instead of asdict()'s recursive deep copy, which
        # made exporting 100,000 turns take seconds.
        data = dict(self.__dict__)
        # Plain strings outside the process: JSON, CSV and SQLite see the values.
        data["cache_outcome"] = str(self.cache_outcome)
        data["stop_reason"] = str(self.stop_reason)
        data["decode_tok_s"] = None  # set below; here for TURN_FIELDS' order
        data["cost_usd"] = self.cost_usd
        for name, digits in _ROUNDED:
            if data[name] is not None:
                data[name] = round(data[name], digits)
        # From the decode time stored: the rate read back from that time is the one stored.
        rate = decode_rate(data["generated_tokens"], data["decode_ms"])
        data["decode_tok_s"] = round(rate, MEASURED_DIGITS) if rate is not None else None
        return data

    def __post_init__(self) -> None:
        # Stored and exported as text; in memory as the enums (unknown text,
        # from a newer chatterm, stays text).
        if self.cache_outcome:
            self.cache_outcome = _enum_or_text(CacheOutcome, self.cache_outcome)
        if self.stop_reason:
            self.stop_reason = _enum_or_text(StopReason, self.stop_reason)

    @classmethod
    def from_dict(cls, data: dict) -> "TurnMetrics":
        return cls(**{k: v for k, v in data.items() if k in _FIELD_NAME_SET})


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(TurnMetrics))

_FIELD_NAME_SET = frozenset(_FIELD_NAMES)

TURN_FIELDS: tuple[str, ...] = _FIELD_NAMES + (
    "decode_tok_s",
    "cost_usd",
)
"""Every key of `TurnMetrics.to_dict()`, in a stable order."""

def decode_rate(generated_tokens: int, decode_ms: float) -> float | None:
    """Tokens/s after the first token: (K - 1) / decode time; None under 2 tokens."""
    if generated_tokens < 2 or decode_ms <= 0:
        return None
    return (generated_tokens - 1) / (decode_ms / 1000.0)


MEASURED_DIGITS = 3
"""`to_dict()` rounds times in ms and the decode rate to this many decimals (a
microsecond; a thousandth of a token/s), far below what a measurement
resolves, so storage and exports read `161.131`, not `161.1311270007718`;
`submitted_at` (Unix seconds) to the microsecond."""
STAMP_DIGITS = 6
"""Unix seconds are stored to the microsecond (`submitted_at`, a session's start)."""
_ROUNDED: tuple[tuple[str, int], ...] = (
    *((name, MEASURED_DIGITS) for name in TURN_FIELDS if name.endswith("_ms")),
    ("submitted_at", STAMP_DIGITS),
)


USD_DIGITS = 12
"""Dollar amounts are rounded to this many decimals: a millionth of a cent, far
below any price's precision, and enough to drop binary floating point noise
(0.00010949999999999999 for 0.0001095) before it reaches storage or exports."""


def usd(amount: float) -> float:
    return round(amount, USD_DIGITS)


def percentile(values: Iterable[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100) of the values, None when empty."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass
class SessionSummary:
    turns: int = 0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    ttft_max_ms: float | None = None
    mean_decode_tok_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """In the context before the turn (`TurnMetrics.cached_tokens`): `reused_tokens`
    and what was prefilled for the turn before it was sent."""
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    cost_usd: float = 0.0
    saved_prefill_s: float = 0.0
    saved_usd: float = 0.0
    energy_wh: float | None = None

    @property
    def early_tokens(self) -> int:
        """Of `cached_tokens`, those prefilled for their turn before it was sent
        (`TurnMetrics.early_tokens`)."""
        return self.cached_tokens - self.reused_tokens

    @classmethod
    def of(cls, turns: Iterable[TurnMetrics]) -> "SessionSummary":
        turns = list(turns)
        ttfts = [t.ttft_ms for t in turns if t.ttft_ms is not None]
        rates = [t.decode_tok_s for t in turns if t.decode_tok_s is not None]
        energies = [t.energy_wh for t in turns if t.energy_wh is not None]
        return cls(
            turns=len(turns),
            ttft_p50_ms=percentile(ttfts, 50),
            ttft_p95_ms=percentile(ttfts, 95),
            ttft_max_ms=max(ttfts) if ttfts else None,
            mean_decode_tok_s=sum(rates) / len(rates) if rates else None,
            prompt_tokens=sum(t.prompt_tokens for t in turns),
            cached_tokens=sum(t.cached_tokens for t in turns),
            reused_tokens=sum(t.reused_tokens for t in turns),
            prefilled_tokens=sum(t.prefilled_tokens for t in turns),
            generated_tokens=sum(t.generated_tokens for t in turns),
            cost_usd=sum(t.cost_usd for t in turns),
            saved_prefill_s=sum(t.saved_prefill_ms for t in turns) / 1000.0,
            saved_usd=sum(t.saved_usd for t in turns),
            energy_wh=sum(energies) if energies else None,
        )
