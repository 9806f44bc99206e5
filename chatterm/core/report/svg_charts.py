"""Static SVG charts for the HTML report: no script, no external reference.

Contract:
- `ttft_chart`, `decode_chart` and `cost_chart` draw every session of a report
  on one chart (x: turn number; one colour per session) with axes, ticks, axis
  titles and a legend, and return an inline `<svg>` element as a string.
  `timeline_bar` draws one turn's waiting | restore | prefill | first token |
  decode bar to scale, for a table cell.
- Every drawn value carries its number in `data-*` attributes (session key,
  turn, part, value) and a `<title>` tooltip, so the chart can be checked
  against the stored metrics and read without a script.
- A turn that produced no first token is drawn as a "✕" mark, never as a
  zero; a stopped turn gets a hollow circle centred on its value (the top of
  its bar, or its point), so the mark never adds height to the bar.
- The y axis's unit is written above the axis, left of the plot, level with
  nothing else: tick labels of any width cannot run into it.
- Text that came from outside (session labels) goes through
  `chatterm.core.report.escape.html_text`; everything else is numbers and fixed words.

Why hand-drawn SVG: the Python chart libraries either emit JavaScript (pygal,
plotly, bokeh, altair) or bring a plotting stack of tens of MB for three bar and
line charts (matplotlib), and none put checkable data on the marks.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from chatterm.core.metrics.format import fmt_usd
from chatterm.core.metrics.timeline import PART_LABELS, PARTS, TTFT_PARTS, Timeline
from chatterm.core.report.escape import html_text
from chatterm.core.report.figures import SessionReport, TurnView
from chatterm.core.report.words import PART_COLOURS
from chatterm.core.report.words import session_colour as colour

PART_OPACITY = {"waiting": 0.12, "restore": 0.35, "shift": 0.5, "prefill": 1.0, "first_token": 0.65, "decode": 0.2}
"""On the TTFT chart colour tells sessions apart, so opacity tells the parts apart."""

WIDTH, HEIGHT = 760, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 34, 54
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
UNIT_Y = TOP - 14
"""Baseline of the y unit: its 12px text ends 10px above the top tick label's top."""
POINT_R = 3.5
"""Radius of a line chart's point and of the stopped-turn circle (on the TTFT bars too)."""


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `top` (1, 2, 2.5 or 5 times a power of ten)."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < top - 1e-12 * top:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def tick_label(value: float, step: float) -> str:
    """A tick value with as many decimals as the step needs (0.0025 -> 4)."""
    decimals = 0
    while decimals < 10 and abs(round(step, decimals) - step) > step * 1e-9:
        decimals += 1
    return f"{value:,.{decimals}f}"


def _attrs(**data: object) -> str:
    return " ".join(f'data-{k.replace("_", "-")}="{html_text(str(v))}"' for k, v in data.items())


def _frame(title: str, y_title: str, ticks: list[float], turns: int, label_every: int) -> list[str]:
    """Title, horizontal grid, y ticks, x axis with turn numbers, axis titles."""
    top = ticks[-1]
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    out = [
        f'<text class="title" x="{WIDTH / 2:.1f}" y="18" text-anchor="middle">{html_text(title)}</text>',
    ]
    for tick in ticks:
        y = TOP + PLOT_H - tick / top * PLOT_H
        out.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{tick_label(tick, step)}</text>'
        )
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{TOP + PLOT_H}" y2="{TOP + PLOT_H}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + PLOT_H}"/>')
    slot = PLOT_W / max(turns, 1)
    for turn in range(1, turns + 1):
        if turn == 1 or turn % label_every == 0:
            x = LEFT + (turn - 0.5) * slot
            out.append(f'<text class="tick" x="{x:.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">{turn}</text>')
    out.append(
        f'<text class="axis-title" x="{LEFT + PLOT_W / 2:.1f}" y="{HEIGHT - 22}" text-anchor="middle">turn</text>'
    )
    out.append(
        f'<text class="axis-title" x="{LEFT - 6}" y="{UNIT_Y}" text-anchor="end">{html_text(y_title)}</text>'
    )
    return out


def _legend(reports: Sequence[SessionReport], extra: Sequence[str] = ()) -> str:
    """Session swatches (and fixed notes) under the chart, as HTML (it wraps)."""
    items = [
        f'<span class="key"><span class="swatch" style="background:{colour(n)}"></span>{html_text(r.label)}</span>'
        for n, r in enumerate(reports)
    ]
    items.extend(f'<span class="key">{html_text(note)}</span>' for note in extra)
    return '<div class="legend">' + "".join(items) + "</div>"


def _svg(label: str, body: list[str]) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{html_text(label)}" '
        f'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )


def _turns(reports: Sequence[SessionReport]) -> int:
    return max((len(r.turns) for r in reports), default=0)


def _label_every(turns: int) -> int:
    return max(1, math.ceil(turns / 20))


MARK_NOTES = ("✕ no first token (failed or stopped before it)", "○ stopped by the user")


def _stopped_mark(cx: float, cy: float, stroke: str) -> str:
    return (f'<circle class="stopped" cx="{cx:.2f}" cy="{cy:.2f}" r="{POINT_R}" stroke="{stroke}" '
            'stroke-width="1.5" fill="none"/>')


def ttft_chart(reports: Sequence[SessionReport]) -> str:
    """Time to first token per turn, stacked waiting / restore / prefill / first token."""
    turns = _turns(reports)
    top = max((sum(v.timeline.ms(p) for p in TTFT_PARTS) for r in reports for v in r.turns), default=0.0)
    ticks = nice_ticks(top * 1.08)
    scale = PLOT_H / ticks[-1]
    body = _frame("Time to first token per turn", "ms", ticks, turns, _label_every(turns))
    slot = PLOT_W / max(turns, 1)
    bar_w = slot * 0.8 / max(len(reports), 1)
    base = TOP + PLOT_H
    for n, report in enumerate(reports):
        for view in report.turns:
            x = LEFT + (view.index - 1) * slot + slot * 0.1 + n * bar_w
            tl = view.timeline
            body.append(f'<g class="bar" {_attrs(session=report.key, turn=view.index, status=tl.status)}>')
            body.append(f"<title>{html_text(_ttft_tooltip(report, view))}</title>")
            if not tl.reached_first_token:
                body.append(
                    f'<text class="mark" x="{x + bar_w / 2:.1f}" y="{base - 4}" text-anchor="middle" '
                    f'style="fill:{colour(n)}">✕</text></g>'
                )
                continue
            y = base
            for part in TTFT_PARTS:
                h = tl.ms(part) * scale
                y -= h
                body.append(
                    f'<rect class="seg" {_attrs(part=part, ms=tl.ms(part))} x="{x:.2f}" y="{y:.2f}" '
                    f'width="{bar_w:.2f}" height="{h:.2f}" fill="{colour(n)}" fill-opacity="{PART_OPACITY[part]}"/>'
                )
            if tl.status == "stopped":
                body.append(_stopped_mark(x + bar_w / 2, y, colour(n)))
            body.append("</g>")
    parts = " · ".join(f"{PART_LABELS[p]} {_shade(PART_OPACITY[p])}" for p in TTFT_PARTS)
    return _svg("Time to first token per turn", body) + _legend(reports, (f"bottom to top: {parts}", *MARK_NOTES))


def _shade(opacity: float) -> str:
    return "faint" if opacity < 0.2 else "light" if opacity < 0.5 else "solid" if opacity == 1 else "medium"


def _ttft_tooltip(report: SessionReport, view: TurnView) -> str:
    tl = view.timeline
    head = f"{report.key} turn {view.index}" + ("" if tl.status == "ok" else f" ({tl.status})")
    if not tl.reached_first_token:
        return f"{head}: no first token"
    parts = ", ".join(f"{PART_LABELS[p]} {tl.ms(p):,.1f} ms" for p in TTFT_PARTS)
    return f"{head}: TTFT {view.record.metrics.ttft_ms:,.1f} ms = {parts}"


def _line_chart(
    reports: Sequence[SessionReport],
    title: str,
    y_title: str,
    value: Callable[[TurnView], float | None],
    fmt: Callable[[float], str],
    name: str,
) -> str:
    turns = _turns(reports)
    values = [v for r in reports for t in r.turns if (v := value(t)) is not None]
    ticks = nice_ticks(max(values, default=0.0) * 1.08)
    scale = PLOT_H / ticks[-1]
    body = _frame(title, y_title, ticks, turns, _label_every(turns))
    slot = PLOT_W / max(turns, 1)
    base = TOP + PLOT_H
    for n, report in enumerate(reports):
        segment: list[str] = []
        lines: list[list[str]] = [segment]
        marks = []
        for view in report.turns:
            x = LEFT + (view.index - 0.5) * slot
            v = value(view)
            status = view.timeline.status
            tip = f"{report.key} turn {view.index}" + ("" if status == "ok" else f" ({status})")
            if v is None:
                segment = []
                lines.append(segment)
                if not view.timeline.reached_first_token:
                    marks.append(
                        f'<g class="point" {_attrs(session=report.key, turn=view.index, status=status)}>'
                        f"<title>{html_text(tip)}: no first token</title>"
                        f'<text class="mark" x="{x:.1f}" y="{base - 4}" text-anchor="middle" '
                        f'style="fill:{colour(n)}">✕</text></g>'
                    )
                continue
            y = base - v * scale
            segment.append(f"{x:.2f},{y:.2f}")
            point = (_stopped_mark(x, y, colour(n)) if status == "stopped" else
                     f'<circle cx="{x:.2f}" cy="{y:.2f}" r="{POINT_R}" stroke="{colour(n)}" stroke-width="1.5" '
                     f'fill="{colour(n)}"/>')
            marks.append(
                f'<g class="point" {_attrs(session=report.key, turn=view.index, status=status, **{name: v})}>'
                f"<title>{html_text(f'{tip}: {fmt(v)}')}</title>{point}</g>"
            )
        for points in lines:
            if len(points) > 1:
                body.append(
                    f'<polyline class="line" points="{" ".join(points)}" fill="none" stroke="{colour(n)}" '
                    'stroke-width="2"/>'
                )
        body.extend(marks)
    return _svg(title, body) + _legend(reports, MARK_NOTES)


def decode_chart(reports: Sequence[SessionReport]) -> str:
    """Decode tokens/s per turn; a turn with fewer than 2 tokens has no point."""
    return _line_chart(
        reports, "Decode rate per turn", "tokens/s",
        lambda v: v.record.metrics.decode_tok_s, lambda x: f"{x:,.1f} tok/s", "tok_s",
    )


def cost_chart(reports: Sequence[SessionReport]) -> str:
    """Cumulative API-equivalent cost after each turn."""
    return _line_chart(
        reports, "Cumulative cost (API-equivalent)", "USD",
        lambda v: v.cumulative_usd, fmt_usd, "usd",
    )


def timeline_bar(tl: Timeline, scale_ms: float, width: int = 180) -> str:
    """One turn's waiting | restore | prefill | first token | decode, `scale_ms` wide."""
    body, x = [], 0.0
    scale = width / scale_ms if scale_ms > 0 else 0.0
    for part in PARTS:
        w = tl.ms(part) * scale
        if w > 0:
            body.append(
                f'<rect {_attrs(part=part, ms=tl.ms(part))} x="{x:.2f}" y="0" width="{w:.2f}" height="12" '
                f'fill="{PART_COLOURS[part]}"><title>{PART_LABELS[part]} {tl.ms(part):,.1f} ms</title></rect>'
            )
            x += w
    return (
        f'<svg class="timeline" viewBox="0 0 {width} 12" width="{width}" height="12" role="img" '
        f'aria-label="turn timeline" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )
