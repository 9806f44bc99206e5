"""The Markdown report: tables, plus Mermaid `xychart-beta` charts that GitHub
and GitLab render where the Markdown is read.

Contract:
- `render_markdown(reports)`: a title; with several sessions a comparison
  table; charts of every session (time to first token per turn stacked by
  waiting / restore / prefill / first token, decode rate per turn, cumulative
  cost); then
  per session its facts, summary, where the time went (a to-scale text bar per
  turn and the measured per-token costs), where the money went (cost split) and
  what it would cost under every price profile, the per-turn table and the
  messages (each turn's user text and reply, whole, each in a fenced code
  block: `escape.md_block`, so they read as written and render literally),
  and for a session with branches the branch of each turn
  (`chatterm.core.report.branches`).
- Mermaid has no stacked bars and no legend: the TTFT chart overlays
  cumulative bars (whole TTFT, then up to the end of the prefill, of the
  restore, of the wait) so each colour's visible band is one part, and the
  caption names the colours. Chart
  categories are turn numbers and status words only: no stored text reaches a
  Mermaid block. A failed or stopped turn is labelled `error` or `stopped` on
  the axis, so an empty bar reads as a failure, not a zero.
- Every stored string goes through `chatterm.core.report.escape.md_escape`.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from chatterm.core.metrics.timeline import PART_GLYPHS, PART_LABELS, PARTS, bar_cells
from chatterm.core.report import words
from chatterm.core.report.branches import BRANCH_HEADER, BRANCH_NOTE, branch_rows, fork_sentence, has_branches
from chatterm.core.report.escape import md_block, md_escape
from chatterm.core.report.figures import SessionReport, TurnView

BAR_CELLS = 24
# Colours of the overlaid TTFT bars, in drawing order: whole TTFT (its visible top
# is the first-token part), waiting + restore + prefill (its top is prefill),
# waiting + restore, waiting.
TTFT_PALETTE = tuple(words.PART_COLOURS[p] for p in ("first_token", "prefill", "restore", "waiting"))


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> str:
    """A Markdown table; `align` has one of "l"/"r" per column. Cells must be escaped."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"


def render_markdown(reports: Sequence[SessionReport]) -> str:
    parts = ["# chatterm latency report\n"]
    if not reports:
        parts.append("\nNo sessions.\n")
        return "".join(parts)
    if len(reports) > 1:
        parts.append("\n## Comparison\n\n")
        parts.append(table(
            words.comparison_header(),
            ([md_escape(c) for c in words.comparison_row(r)] for r in reports),
            "llllrrrrrrr",
        ))
    if any(r.turns for r in reports):
        parts.append(_charts(reports))
    for r in reports:
        parts.append(_session(r))
    return "".join(parts)


# -- charts ----------------------------------------------------------------------
def _category(r: SessionReport, index: int, status: str, several: bool) -> str:
    label = f"{r.key} {index}" if several else str(index)
    return f"{label} {status}" if status != "ok" else label


def _mermaid(title: str, y_title: str, categories: list[str], series: list[list[float]],
             palette: Sequence[str], digits: int) -> str:
    cats = ", ".join(f'"{c}"' for c in categories)
    lines = [
        "```mermaid",
        "---",
        "config:",
        "  themeVariables:",
        "    xyChart:",
        f'      plotColorPalette: "{", ".join(palette[: len(series)])}"',
        "---",
        "xychart-beta",
        f'  title "{title}"',
        f"  x-axis [{cats}]",
        f'  y-axis "{y_title}"',
    ]
    lines.extend(f"  bar [{', '.join(f'{v:.{digits}f}' for v in values)}]" for values in series)
    lines.append("```")
    return "\n".join(lines) + "\n"


def _charts(reports: Sequence[SessionReport]) -> str:
    several = len(reports) > 1
    categories, total, upto_prefill, upto_restore, waiting = [], [], [], [], []
    per_session_rate: list[list[float]] = [[] for _ in reports]
    per_session_cost: list[list[float]] = [[] for _ in reports]
    for n, r in enumerate(reports):
        for v in r.turns:
            tl = v.timeline
            categories.append(_category(r, v.index, tl.status, several))
            waiting.append(tl.waiting_ms)
            upto_restore.append(tl.waiting_ms + tl.restore_ms + tl.shift_ms)  # a shift is a restore's work
            upto_prefill.append(tl.waiting_ms + tl.restore_ms + tl.shift_ms + tl.prefill_ms)
            total.append(tl.waiting_ms + tl.restore_ms + tl.shift_ms + tl.prefill_ms + tl.first_token_ms)
            for k in range(len(reports)):
                rate = v.record.metrics.decode_tok_s if k == n else None
                per_session_rate[k].append(rate or 0.0)
                per_session_cost[k].append(v.cumulative_usd if k == n else 0.0)
    who = " Categories are session key and turn number (see the comparison table)." if several else ""
    session_colours = (
        " Colours by session: " + ", ".join(f"{r.key} {words.session_colour(i)}"
                                            for i, r in enumerate(reports)) + "."
        if several else ""
    )
    return "".join([
        "\n## Charts\n\n",
        _mermaid("Time to first token per turn (ms)", "ms", categories,
                 [total, upto_prefill, upto_restore, waiting], TTFT_PALETTE, 1),
        "\nEach bar is the time to first token, bottom to top: waiting for the engine (grey), "
        "restore (brown), prefill (blue), "
        "first token (orange: templating, tokenizing, sampling). An axis label ending in `error` or "
        "`stopped` marks a turn that failed or that the user stopped; such a turn without a bar "
        f"produced no first token (it is not a zero).{who}\n\n",
        _mermaid("Decode rate per turn (tokens/s)", "tokens/s", categories, per_session_rate,
                 words.SESSION_COLOURS, 1),
        "\nNo bar: the turn generated fewer than 2 tokens (no rate to measure) "
        f"or none at all.{session_colours}\n\n",
        _mermaid("Cumulative cost (USD, API-equivalent)", "USD", categories, per_session_cost,
                 words.SESSION_COLOURS, 6),
    ])


# -- one session -------------------------------------------------------------------
def _text_bar(v: TurnView, scale: float) -> str:
    cells = bar_cells(v.timeline, scale, BAR_CELLS)
    return "`" + "".join(PART_GLYPHS[p] * n for p, n in cells).ljust(BAR_CELLS) + "`" if cells else "–"


def _message(v: TurnView) -> str:
    """One turn's texts under the turn's number, as the turns table numbers it."""
    rec = v.record
    reply = md_block(rec.reply) if rec.reply else "*(no reply)*\n"
    return f"\n**Turn {rec.index}: you**\n\n{md_block(rec.user_text)}\n**Turn {rec.index}: reply**\n\n{reply}"


def _time_table(r: SessionReport) -> str:
    scale = max((v.timeline.total_ms for v in r.turns), default=0.0)
    rows = [words.time_row(v, md_escape, _text_bar(v, scale)) for v in r.turns]
    legend = " · ".join(f"{PART_GLYPHS[p]} {PART_LABELS[p]}" for p in PARTS)
    return table(words.TIME_HEADER, rows, "rllrrrrrrrr") + f"\nTimeline, to scale across this session: {legend}.\n"


def _what_if(r: SessionReport) -> str:
    if not r.what_if:
        return "\nNo price profiles were given.\n"
    header = ["", *(md_escape(h) for h in words.what_if_header(r.what_if, r.priced_with))]
    columns = words.what_if_columns(r.what_if)
    rows = [[label, *(col[i] for col in columns)] for i, label in enumerate(words.WHAT_IF_ROWS)]
    note = words.priced_with_note(r)
    return table(header, rows, "l" + "r" * len(columns)) + (f"\n{md_escape(note)}\n" if note else "")


def _session(r: SessionReport) -> str:
    title = f"\n## Session {r.info.id}" + (f" ({r.key})" if r.key != "S1" else "") + "\n\n"
    parts = [
        title,
        table(["Session", ""], [(k, md_escape(v)) for k, v in words.session_facts(r)], "ll"),
        "\n### Summary\n\n",
        table(["Metric", "Value"], words.summary_rows(r), "lr"),
    ]
    if r.turns:
        parts += [
            "\n### Where the time went\n\n",
            _time_table(r),
            "\n" + "\n".join(f"- {line}" for line in words.token_cost_sentences(r.token_costs)) + "\n",
            "\n### Where the money went\n\n",
            table(["Part", "Tokens", "USD", "Share of cost"], words.split_rows(r.split), "lrrr"),
            f"\n{words.split_sentence(r.split)}\n",
            "\n### What if: this session under every price profile\n\n",
            _what_if(r),
        ]
    parts.append("\n### Turns\n\n")
    if r.turns:
        align = "".join("l" if i in words.TURN_TEXT_COLUMNS else "r" for i in range(len(words.TURN_HEADER)))
        parts.append(table(words.TURN_HEADER, [words.turn_row(v, md_escape) for v in r.turns], align))
    else:
        parts.append("No turns.\n")
    notes = [note for v in r.turns for note in words.turn_notes(v, md_escape)]
    if notes:
        parts.append("\n" + "\n".join(f"- {note}" for note in notes) + "\n")
    if r.turns:
        parts.append("\n### Messages\n")
        parts += [_message(v) for v in r.turns]
    if has_branches(r):
        fork = fork_sentence(r)
        parts += ["\n### Branches\n\n", f"{md_escape(BRANCH_NOTE)}\n\n",
                  table(BRANCH_HEADER, branch_rows(r, md_escape), "rlrrl"),
                  f"\n{md_escape(fork)}\n" if fork else ""]
    return "".join(parts)
