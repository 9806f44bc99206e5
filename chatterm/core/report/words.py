"""Words, numbers and colours shared by the Markdown and HTML reports (plain `str`, unescaped).

Contract: pure formatting of `chatterm.core.report.figures` figures; callers escape the
result for their format (ids from files and the database are inside some rows).
Dollar amounts follow the app's one precision rule (`chatterm.core.metrics.format.usd_number`),
without the `$`: the column or row title says USD. The turns table holds the
figures; each turn's texts, whole, are in a messages section of their own, so
that a text gets the page's width instead of a narrow column of a wide table.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable, Sequence

from chatterm.core.metrics.format import counted, fmt_int, usd_number
from chatterm.core.metrics.timeline import TokenCosts
from chatterm.core.metrics.whatif import CostSplit, WhatIf, switch_tokens
from chatterm.core.report.figures import SessionReport, TurnView

DASH = "–"

SESSION_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2", "#9c755f", "#edc948")
"""One colour per session on the comparison charts (colour-blind-safe Tableau 10)."""
PART_COLOURS = {"waiting": "#bab0ac", "restore": "#9c755f", "shift": "#e15759", "prefill": "#4e79a7",
                "first_token": "#f28e2b", "decode": "#59a14f"}
"""A timeline's parts: grey, brown, red, blue, orange, green."""


def session_colour(n: int) -> str:
    return SESSION_COLOURS[n % len(SESSION_COLOURS)]


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return DASH
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def usd(value: float) -> str:
    return usd_number(value)


def pct(share: float | None) -> str:
    return DASH if share is None else f"{share * 100:.1f} %"


def per_token(value: float | None, note: str) -> str:
    """A per-token figure, or why there is none, in a few words."""
    if value is not None:
        return f"{value:.2f}"
    if note.startswith("too few"):
        return "too few tokens"
    return "not recorded"


def ratio(costs: TokenCosts) -> str:
    return DASH if costs.ratio is None else f"{costs.ratio:.1f}x"


TIME_HEADER = ["#", "state", "timeline", "waiting ms", "restore ms", "prefill ms", "first token ms", "decode ms",
               "prefill ms/token", "decode ms/token", "decode/prefill"]


def time_row(v: TurnView, escape: Callable[[str], str], bar: str) -> list[str]:
    """One turn of the time table: `escape` makes text inert for the format,
    `bar` is the turn's timeline already drawn in it."""
    tl, c = v.timeline, v.costs
    state = tl.status if tl.reached_first_token else f"{tl.status}, no first token"
    return [
        str(v.index), escape(state), bar,
        num(tl.waiting_ms), num(tl.restore_ms), num(tl.prefill_ms),
        num(tl.first_token_ms) if tl.reached_first_token else DASH,
        num(tl.decode_ms),
        escape(per_token(c.prefill_ms_per_token, c.prefill_note)),
        escape(per_token(c.decode_ms_per_token, c.decode_note)),
        escape(ratio(c)),
    ]


TURN_HEADER = ["#", "TTFT ms", "restore ms", "prefill ms", "decode tok/s", "prompt", "cached", "before Enter",
               "prefilled", "generated", "cache", "stop", "cost USD"]
"""The prompt is cached + before Enter + prefilled: "cached" is what was reused
from earlier prompts (what the cost prices as cached input, as the dashboard's
"cached" row), "before Enter" what was prefilled for this turn before it was
sent (`TurnMetrics.early_tokens`: typed ahead, its history prefilled ahead,
or the persona's prompt when it was loaded), "prefilled" what the turn did."""
TURN_TEXT_COLUMNS = frozenset({10, 11})
"""Columns of `TURN_HEADER` that hold text (left-aligned); the others are numbers."""
MESSAGE_HEADER = ["#", "user", "reply"]


def turn_row(v: TurnView, escape: Callable[[str, int | None], str]) -> list[str]:
    """One turn of the turns table (`TURN_HEADER`): `escape(text, limit)` makes
    text inert for the format."""
    m, rec = v.record.metrics, v.record
    return [
        str(rec.index), num(m.ttft_ms), num(m.restore_ms), num(m.prefill_ms), num(m.decode_tok_s),
        str(m.prompt_tokens), str(m.reused_tokens), str(m.early_tokens), str(m.prefilled_tokens),
        str(m.generated_tokens),
        escape(m.cache_outcome or "", None), escape(m.stop_reason or "", None), usd(m.cost_usd),
    ]


def message_row(v: TurnView, escape: Callable[[str], str]) -> list[str]:
    """One turn of the messages table (`MESSAGE_HEADER`), its texts whole."""
    rec = v.record
    return [str(rec.index), escape(rec.user_text), escape(rec.reply)]


def turn_notes(v: TurnView, escape: Callable[[str, int | None], str]) -> list[str]:
    """What the turns table cannot show of a turn, one sentence each."""
    m, index = v.record.metrics, v.record.index
    notes = []
    if m.error:
        notes.append(f"Turn {index}: error: {escape(m.error, None)}")
    if m.cache_detail:
        notes.append(f"Turn {index}: cache: {escape(m.cache_detail, None)}")
    if at_switch := switch_tokens(m):
        notes.append(f"Turn {index}: {fmt_int(at_switch)} of its prompt tokens were prefilled with the persona, "
                     "for this turn (priced as uncached input)")
    if m.restore_at_switch and m.restore_ms:
        notes.append(f"Turn {index}: its {num(m.restore_ms)} ms restore was done before the turn was sent, "
                     "at the persona switch or ahead of the message (not part of its TTFT)")
    if m.cut_turns:
        how = (f"shifted out of the KV state ({fmt_int(m.shifted_tokens)} tokens, {num(m.shift_ms)} ms)"
               if m.shifted_tokens else "the kept turns prefilled again")
        notes.append(f"Turn {index}: {counted(m.cut_turns, 'more oldest turn')} left the context, {how}")
    elif m.dropped_turns:
        notes.append(f"Turn {index}: {counted(m.dropped_turns, 'oldest turn')} not in the context")
    return notes


def session_facts(r: SessionReport) -> list[tuple[str, str]]:
    info = r.info
    # A session carried on on another model names each, in the order its turns used them.
    used = list(dict.fromkeys(t.record.metrics.model_id for t in r.turns if t.record.metrics.model_id))
    return [
        ("Started", utc(info.started_at)),
        ("Model", ", then ".join(used) if len(used) > 1 else info.model_id),
        ("Model identity", info.model_identity),
        ("Engine", info.engine),
        ("Device", info.device),
        ("Persona", info.persona_id),
    ]


def summary_rows(r: SessionReport) -> list[tuple[str, str]]:
    s = r.summary
    rows = [
        ("Turns", str(s.turns)),
        ("TTFT p50 / p95 / max (ms)", " / ".join(num(v) for v in (s.ttft_p50_ms, s.ttft_p95_ms, s.ttft_max_ms))),
        ("Mean decode rate (tok/s)", num(s.mean_decode_tok_s)),
        ("Prompt tokens (cached / before Enter / prefilled)",
         f"{s.prompt_tokens} ({s.reused_tokens} / {s.early_tokens} / {s.prefilled_tokens})"),
        ("Generated tokens", str(s.generated_tokens)),
        ("Cost (USD, API-equivalent)", usd(s.cost_usd)),
        ("Cache savings: prefill time (s)", f"{s.saved_prefill_s:.3f}"),
        ("Cache savings: cost (USD)", usd(s.saved_usd)),
    ]
    if s.energy_wh is not None:
        rows.append(("GPU energy (Wh)", f"{s.energy_wh:.4f}"))
    return rows


def token_cost_sentences(costs: TokenCosts) -> list[str]:
    """The session's measured per-token costs, said plainly."""
    lines = []
    if costs.prefill_ms_per_token is not None:
        lines.append(
            f"Prefill: {costs.prefill_ms_per_token:.2f} ms per input token "
            f"(over {costs.prefill_tokens} prefilled tokens)."
        )
    else:
        lines.append(f"Prefill: not measured — {costs.prefill_note}.")
    if costs.decode_ms_per_token is not None:
        lines.append(
            f"Decode: {costs.decode_ms_per_token:.2f} ms per output token "
            f"(over {costs.decode_tokens} decoded tokens)."
        )
    else:
        lines.append(f"Decode: not measured — {costs.decode_note}.")
    if costs.ratio is not None:
        lines.append(f"An output token took {costs.ratio:.1f}x as long as an input token on this machine.")
    return lines


def split_rows(split: CostSplit) -> list[tuple[str, str, str, str]]:
    """(part, tokens, USD, share of USD) for input uncached / cached, output, total."""
    total = split.total_usd

    def share(value: float) -> str:
        return pct(value / total) if total > 0 else DASH

    return [
        ("Input, uncached", str(split.uncached_tokens), usd(split.uncached_usd), share(split.uncached_usd)),
        ("Input, cached", str(split.cached_tokens), usd(split.cached_usd), share(split.cached_usd)),
        ("Output", str(split.output_tokens), usd(split.output_usd), share(split.output_usd)),
        ("Total", str(split.input_tokens + split.output_tokens), usd(total), share(total)),
    ]


def split_sentence(split: CostSplit) -> str:
    sentence = (
        f"Input is {pct(split.input_token_share)} of the tokens and "
        f"{pct(split.input_cost_share)} of the cost."
    )
    if split.switch_tokens:
        sentence += (f" Uncached input includes {fmt_int(split.switch_tokens)} tokens prefilled with the persona: "
                     "its prompt, prefilled for the first turn after it was loaded (at launch or a switch).")
    return sentence


WHAT_IF_ROWS = (
    "Input, uncached (USD)",
    "Input, cached (USD)",
    "Output (USD)",
    "Total (USD)",
    "Without the cache (USD)",
    "Cache saved (USD)",
    "Input share of cost",
)


def what_if_header(rows: Sequence[WhatIf], priced_with: Sequence[str]) -> list[str]:
    """Column titles: profile label, its date ("no date" when its table gives none),
    and * for the profile the session used."""
    return [
        f"{w.profile.label} ({w.profile.as_of or 'no date'}){' *' if w.profile.id in priced_with else ''}"
        for w in rows
    ]


def priced_with_note(r: SessionReport) -> str:
    """Which column the stored costs match (`*`), or that their profile is gone."""
    shown = {w.profile.id for w in r.what_if}
    if not r.priced_with:
        return ""
    ids = ", ".join(r.priced_with)
    if shown & set(r.priced_with):
        return f"* the profile this session's stored costs use ({ids})."
    return f"The stored costs use {ids}, which is not in the current price profiles."


def what_if_columns(rows: Sequence[WhatIf]) -> list[list[str]]:
    """One column of `WHAT_IF_ROWS` values per profile."""
    columns = []
    for w in rows:
        s = w.split
        saved = usd(w.saved_usd) if w.has_cache_discount else f"{usd(w.saved_usd)} (no cached-input discount)"
        columns.append([
            usd(s.uncached_usd), usd(s.cached_usd), usd(s.output_usd), usd(w.total_usd),
            usd(w.without_cache_usd), saved, pct(s.input_cost_share),
        ])
    return columns


def comparison_header() -> list[str]:
    return ["Session", "Model", "Engine", "Device", "Turns", "TTFT p50 ms", "Mean tok/s",
            "Prefill ms/token", "Decode ms/token", "Decode/prefill", "Cost USD"]


def comparison_row(r: SessionReport) -> list[str]:
    c = r.token_costs
    return [
        f"{r.key} (session {r.info.id})", r.info.model_id, r.info.engine, r.info.device,
        str(r.summary.turns), num(r.summary.ttft_p50_ms), num(r.summary.mean_decode_tok_s),
        per_token(c.prefill_ms_per_token, c.prefill_note), per_token(c.decode_ms_per_token, c.decode_note),
        ratio(c), usd(r.summary.cost_usd),
    ]
