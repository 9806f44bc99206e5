"""A turn's timeline (waiting | restore | prefill | first token | decode) as text, to scale.

Contract:
- `timeline_bar(tl, width, scale_ms)` is a `Content` bar `width` cells wide
  where each part takes its share of `scale_ms` (default: the turn's own total).
  Parts differ by glyph and by theme colour, so the bar reads in any theme and
  without colour.
- `timeline_legend(tl)` names each part with its milliseconds and share, one per
  line (waiting and restore only when they took time), then a restore done at the
  persona switch on a line apart (it is not part of the turn, nor of the bar).
- `token_cost_line(costs)` is the measured ms per input and per output token and
  their ratio, or `too few` (tokens) / `n/a` (no time recorded) where one is missing.
Only numbers and fixed words: nothing here comes from the model or a file.
"""

from __future__ import annotations

from textual.content import Content

from chatterm.core.metrics.format import SEP, fmt_ms
from chatterm.core.metrics.timeline import PART_GLYPHS, PART_LABELS, PARTS, Timeline, TokenCosts, bar_cells

STYLES = {"waiting": "$secondary", "restore": "$warning", "shift": "$error", "prefill": "$primary",
          "first_token": "$accent", "decode": "$success"}


OPTIONAL_PARTS = ("waiting", "restore", "shift")
"""Most turns neither wait, restore nor shift: legends leave these out under half a ms."""


def shown(tl: Timeline, part: str) -> bool:
    """Whether a legend lists `part` (the bar draws whatever has a cell)."""
    return part not in OPTIONAL_PARTS or tl.ms(part) >= 0.5


def timeline_bar(tl: Timeline, width: int, scale_ms: float | None = None) -> Content:
    scale = scale_ms if scale_ms is not None else tl.total_ms
    cells = bar_cells(tl, scale, width)
    if not cells:
        return Content("no first token" if not tl.reached_first_token else "–")
    return Content.assemble(*((PART_GLYPHS[part] * n, STYLES[part]) for part, n in cells))


def timeline_legend(tl: Timeline) -> Content:
    """One line per part: glyph, name, ms and share of the turn."""
    lines = []
    total = tl.total_ms
    for part in PARTS:
        if part == "first_token" and not tl.reached_first_token:
            continue
        if not shown(tl, part):
            continue
        share = f"{tl.ms(part) / total * 100:5.1f} %" if total > 0 else ""
        lines.append(Content.assemble(
            (PART_GLYPHS[part] * 2, STYLES[part]), f" {PART_LABELS[part]:<12}{fmt_ms(tl.ms(part)):>10}  {share}"
        ))
    if tl.switch_restore_ms:
        lines.append(Content(f"before the turn: state restored, {fmt_ms(tl.switch_restore_ms)}"))
    return Content("\n").join(lines)


def per_token(value: float | None, note: str, unit: str = " ms") -> str:
    """ms per token, or `too few` (tokens to measure) / `n/a` (no time recorded)."""
    if value is not None:
        return f"{value:,.2f}{unit}" if value < 10 else f"{value:,.1f}{unit}"
    return "too few" if note.startswith("too few") else "n/a"


def fmt_share(share: float | None) -> str:
    return "–" if share is None else f"{share * 100:.0f} %"


def token_cost_line(costs: TokenCosts) -> str:
    """`in 8.50 ms · out 53.0 ms · 6.2x` per token; `too few` where one is missing."""
    ratio = f"{costs.ratio:,.1f}x" if costs.ratio is not None else "–"
    return SEP.join((
        f"in {per_token(costs.prefill_ms_per_token, costs.prefill_note)}",
        f"out {per_token(costs.decode_ms_per_token, costs.decode_note)}",
        ratio,
    ))
