"""Where a turn's time went, and what a token costs on this machine.

Contract:
- `timeline(m)` splits a turn into waiting | restore | shift | prefill | first
  token | decode, in ms, from the stored `TurnMetrics` only: waiting = `wait_ms`
  (submit until the engine could start the turn, e.g. a persona still being
  prepared), restore = `restore_ms` when the turn restored, shift = `shift_ms`
  (the oldest turns removed from the KV state), prefill = `prefill_ms`, first
  token = `ttft_ms - waiting - restore - shift - prefill` clamped at 0 (the rest of the
  time to first token: templating, tokenizing, sampling), decode = `decode_ms`.
  A restore done before the turn was sent (`restore_at_switch`: at the
  persona switch, or by type-ahead) is not part of the turn: it is
  `Timeline.switch_restore_ms`, outside the parts and their total, drawn
  apart. A turn that never produced a token has no first-token part and
  says so (`Timeline.reached_first_token`), so charts show it as failed or
  stopped, never as a zero.
- `token_costs(m)` measures prefill ms per prefilled token and decode ms per
  generated token (`decode_ms / (generated - 1)`, the same rule as
  `TurnMetrics.decode_tok_s`), and decode/prefill as a ratio. A figure taken
  from too few tokens is not a measurement: fewer than `MIN_PREFILL_TOKENS`
  prefilled or fewer than `MIN_DECODE_TOKENS` generated leaves it None with a
  plain reason. `session_token_costs(turns)` pools the measurable turns (total
  ms over total tokens), so long turns weigh more than short ones.
- Pure functions of stored metrics; nothing here times anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from chatterm.core.metrics.turn_metrics import StopReason, TurnMetrics

MIN_PREFILL_TOKENS = 8
"""Below this, a prefill's fixed cost (one batch, sampling) swamps the per-token cost."""
MIN_DECODE_TOKENS = 2
"""The first token belongs to TTFT: a decode rate needs a second one."""

PARTS = ("waiting", "restore", "shift", "prefill", "first_token", "decode")
PART_LABELS = {
    "waiting": "waiting",
    "restore": "restore",
    "shift": "shift",
    "prefill": "prefill",
    "first_token": "first token",
    "decode": "decode",
}
PART_GLYPHS = {"waiting": "┄", "restore": "▒", "shift": "╳", "prefill": "█", "first_token": "▓", "decode": "░"}
"""One glyph per part, for timelines drawn in text (the TUI, Markdown)."""
TTFT_PARTS = PARTS[:5]
"""The parts that add up to the time to first token."""


@dataclass(frozen=True)
class Timeline:
    waiting_ms: float
    restore_ms: float
    shift_ms: float
    prefill_ms: float
    first_token_ms: float
    decode_ms: float
    reached_first_token: bool
    stop_reason: str
    switch_restore_ms: float = 0.0
    """The persona restored at the switch before this turn: not one of its parts."""

    def ms(self, part: str) -> float:
        return getattr(self, f"{part}_ms")

    @property
    def total_ms(self) -> float:
        return sum(self.ms(p) for p in PARTS)

    @property
    def status(self) -> str:
        """ok, stopped (cancelled), error, max tokens or context full: how a chart marks the turn."""
        return {StopReason.CANCELLED: "stopped", StopReason.ERROR: "error", StopReason.LENGTH: "max tokens",
                StopReason.CONTEXT: "context full"}.get(self.stop_reason, "ok")


def timeline(m: TurnMetrics) -> Timeline:
    waiting = max(m.wait_ms or 0.0, 0.0)
    restored = max(m.restore_ms or 0.0, 0.0)
    restore, before = (0.0, restored) if m.restore_at_switch else (restored, 0.0)
    shift = max(m.shift_ms or 0.0, 0.0)
    prefill = max(m.prefill_ms or 0.0, 0.0)
    if m.ttft_ms is None:
        return Timeline(waiting, restore, shift, prefill, 0.0, 0.0, False, m.stop_reason, before)
    first = max(m.ttft_ms - waiting - restore - shift - prefill, 0.0)
    decode = max(m.decode_ms or 0.0, 0.0)
    return Timeline(waiting, restore, shift, prefill, first, decode, True, m.stop_reason, before)


@dataclass(frozen=True)
class TokenCosts:
    prefill_ms_per_token: float | None
    decode_ms_per_token: float | None
    prefill_note: str = ""
    """Why there is no prefill figure (empty when there is one)."""
    decode_note: str = ""
    prefill_tokens: int = 0
    """Tokens the prefill figure was measured over."""
    decode_tokens: int = 0

    @property
    def ratio(self) -> float | None:
        """How many times longer a decoded token takes than a prefilled one."""
        if self.prefill_ms_per_token and self.decode_ms_per_token is not None:
            return self.decode_ms_per_token / self.prefill_ms_per_token
        return None


def _prefill(m: TurnMetrics) -> tuple[float | None, str]:
    if m.prefilled_tokens < MIN_PREFILL_TOKENS:
        return None, f"too few prefilled tokens to measure ({m.prefilled_tokens}, needs {MIN_PREFILL_TOKENS})"
    if m.ttft_ms is None or not m.prefill_ms or m.prefill_ms <= 0:
        return None, "no prefill time recorded"
    return m.prefill_ms / m.prefilled_tokens, ""


def _decode(m: TurnMetrics) -> tuple[float | None, str]:
    if m.generated_tokens < MIN_DECODE_TOKENS:
        return None, f"too few generated tokens to measure ({m.generated_tokens}, needs {MIN_DECODE_TOKENS})"
    if not m.decode_ms or m.decode_ms <= 0:
        return None, "no decode time recorded"
    return m.decode_ms / (m.generated_tokens - 1), ""


def token_costs(m: TurnMetrics) -> TokenCosts:
    prefill, prefill_note = _prefill(m)
    decode, decode_note = _decode(m)
    return TokenCosts(
        prefill,
        decode,
        prefill_note,
        decode_note,
        m.prefilled_tokens if prefill is not None else 0,
        m.generated_tokens - 1 if decode is not None else 0,
    )


def session_token_costs(turns: Iterable[TurnMetrics]) -> TokenCosts:
    """Total ms over total tokens of the turns where each figure is measurable."""
    prefill_ms = decode_ms = 0.0
    prefill_tokens = decode_tokens = 0
    prefill_enough = decode_enough = False
    turns = list(turns)
    for m in turns:
        if _prefill(m)[0] is not None:
            prefill_ms += m.prefill_ms
            prefill_tokens += m.prefilled_tokens
        prefill_enough |= m.prefilled_tokens >= MIN_PREFILL_TOKENS
        if _decode(m)[0] is not None:
            decode_ms += m.decode_ms
            decode_tokens += m.generated_tokens - 1
        decode_enough |= m.generated_tokens >= MIN_DECODE_TOKENS
    return TokenCosts(
        prefill_ms / prefill_tokens if prefill_tokens else None,
        decode_ms / decode_tokens if decode_tokens else None,
        "" if prefill_tokens else _session_note(turns, prefill_enough, "prefill", "prefilled", MIN_PREFILL_TOKENS),
        "" if decode_tokens else _session_note(turns, decode_enough, "decode", "generated", MIN_DECODE_TOKENS),
        prefill_tokens,
        decode_tokens,
    )


def _session_note(turns: list[TurnMetrics], enough: bool, phase: str, done: str, needs: int) -> str:
    """Why a session has no figure, worded as a turn's is, so both read `too few` or `n/a` alike."""
    if not turns:
        return "no turn yet"
    if enough:
        return f"no {phase} time recorded in the turns with {needs} or more {done} tokens"
    return f"too few {done} tokens in any turn to measure (a turn needs {needs})"


def bar_cells(tl: Timeline, scale_ms: float, width: int) -> list[tuple[str, int]]:
    """(part, character cells) for a text bar `width` cells wide at `scale_ms`.

    Part boundaries are rounded, not part widths, so the bar's length stays to
    scale; a part too short for a cell gets none.
    """
    if scale_ms <= 0 or width <= 0:
        return []
    cells, edge, done = [], 0.0, 0
    for part in PARTS:
        edge += tl.ms(part)
        end = min(round(edge / scale_ms * width), width)
        if end > done:
            cells.append((part, end - done))
            done = end
    return cells
