"""The HTML report: one self-contained file that opens offline in any browser.

Contract:
- `render_html(reports)` returns a whole HTML5 document: inline CSS, inline SVG
  charts (`chatterm.core.report.svg_charts`), tables. No `<script>`, no external
  stylesheet, font, image or link fetch: a Content-Security-Policy meta tag
  (`default-src 'none'`) makes a browser refuse any that slipped in.
- The same content as the Markdown report: with several sessions a comparison
  table; charts of every session (TTFT per turn stacked by waiting / restore /
  prefill / first token, decode rate, cumulative cost); per session its facts, summary,
  per-turn timeline table with per-token costs, cost split, what-if table under
  every price profile, the per-turn table, and the messages table (each turn's
  user text and reply, whole, their line breaks kept, in columns half the page
  wide each: a narrow column of the figures table made every row very tall), and
  for a session with branches the branch of each turn
  (`chatterm.core.report.branches`).
- Every stored string goes through `chatterm.core.report.escape.html_text`
  (`html.escape` after control characters and bidi overrides are made visible).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from chatterm.core.metrics.timeline import PART_LABELS, PARTS
from chatterm.core.report import words
from chatterm.core.report.branches import BRANCH_HEADER, BRANCH_NOTE, branch_rows, fork_sentence, has_branches
from chatterm.core.report.escape import html_lines, html_text
from chatterm.core.report.figures import SessionReport
from chatterm.core.report.svg_charts import cost_chart, decode_chart, timeline_bar, ttft_chart
from chatterm.core.report.words import PART_COLOURS

STYLE = """
:root { color-scheme: light dark; --fg: #1d2329; --muted: #5c6670; --line: #d5dbe1; --bg: #ffffff; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e6e9ec; --muted: #a0a8b0; --line: #3a4148; --bg: #15191d; }
}
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg);
       max-width: 1100px; margin: 2em auto; padding: 0 1em; }
h1, h2, h3 { line-height: 1.2; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; vertical-align: top; }
th { text-align: left; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: var(--muted); }
.chart { width: 100%; max-width: 760px; height: auto; display: block; }
.chart text { fill: var(--fg); font: 12px system-ui, sans-serif; }
.chart .title { font-weight: 600; font-size: 14px; }
.chart .grid { stroke: var(--line); stroke-width: 1; }
.chart .axis { stroke: var(--muted); stroke-width: 1; }
.chart .mark { font-size: 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 4px 0 18px; color: var(--muted); }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 5px; }
.timeline { vertical-align: middle; }
.scroll { overflow-x: auto; }
table.messages { width: 100%; }
table.messages td:not(.n) { width: 50%; overflow-wrap: anywhere; white-space: pre-wrap; }
"""


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: str = "", cls: str = "") -> str:
    """Cells are already HTML; `numeric` has "n" for each right-aligned column."""
    def cell(tag: str, i: int, text: str) -> str:
        right = ' class="n"' if i < len(numeric) and numeric[i] == "n" else ""
        return f"<{tag}{right}>{text}</{tag}>"

    head = "<tr>" + "".join(cell("th", i, h) for i, h in enumerate(header)) + "</tr>"
    body = "".join("<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows)
    attrs = f" class={cls!r}" if cls else ""
    return f'<div class="scroll"><table{attrs}><thead>{head}</thead><tbody>{body}</tbody></table></div>'


def render_html(reports: Sequence[SessionReport]) -> str:
    title = "chatterm latency report"
    if reports:
        title += " — " + ", ".join(f"session {r.info.id}" for r in reports)
    body = [f"<h1>{html_text(title)}</h1>"]
    if not reports:
        body.append("<p>No sessions.</p>")
    if len(reports) > 1:
        body.append("<h2>Comparison</h2>")
        body.append(_table(
            [html_text(h) for h in words.comparison_header()],
            ([html_text(c) for c in words.comparison_row(r)] for r in reports),
            "lllllnnnnnn",
        ))
    if any(r.turns for r in reports):
        body.append("<h2>Charts</h2>")
        body.append(f'<section id="chart-ttft">{ttft_chart(reports)}</section>')
        body.append(f'<section id="chart-decode">{decode_chart(reports)}</section>')
        body.append(f'<section id="chart-cost">{cost_chart(reports)}</section>')
    body.extend(_session(r) for r in reports)
    body.append('<p class="note">Written by chatterm. Costs are what the same '
                "tokens would cost at a public API (price profiles in models.toml), not a bill.</p>")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html_text(title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _pairs(rows: Iterable[tuple[str, str]]) -> str:
    return _table(["", ""], ([html_text(k), html_text(v)] for k, v in rows), "ln")


def _session(r: SessionReport) -> str:
    out = [f'<section class="session" id="session-{r.info.id}">',
           f"<h2>Session {r.info.id} ({html_text(r.key)})</h2>",
           _table(["Session", ""], ([html_text(k), html_text(v)] for k, v in words.session_facts(r))),
           "<h3>Summary</h3>", _pairs(words.summary_rows(r))]
    if r.turns:
        out += ["<h3>Where the time went</h3>", _time_table(r),
                "<ul>" + "".join(f"<li>{html_text(s)}</li>" for s in words.token_cost_sentences(r.token_costs))
                + "</ul>",
                "<h3>Where the money went</h3>",
                _table(["Part", "Tokens", "USD", "Share of cost"],
                       ([html_text(c) for c in row] for row in words.split_rows(r.split)), "lnnn"),
                f"<p>{html_text(words.split_sentence(r.split))}</p>",
                "<h3>What if: this session under every price profile</h3>", _what_if(r)]
    out += ["<h3>Turns</h3>", _turn_table(r) if r.turns else "<p>No turns.</p>"]
    if r.turns:
        rows = [words.message_row(v, html_lines) for v in r.turns]
        out += ["<h3>Messages</h3>", _table(words.MESSAGE_HEADER, rows, "n", cls="messages")]
    if has_branches(r):
        fork = fork_sentence(r)
        out += ["<h3>Branches</h3>", f"<p>{html_text(BRANCH_NOTE)}</p>",
                _table(BRANCH_HEADER, branch_rows(r, html_text), "nlnnl", cls="branches")]
        if fork:
            out.append(f"<p>{html_text(fork)}</p>")
    out.append("</section>")
    return "\n".join(out)


def _time_table(r: SessionReport) -> str:
    scale = max((v.timeline.total_ms for v in r.turns), default=0.0)
    rows = [words.time_row(v, html_text, timeline_bar(v.timeline, scale)) for v in r.turns]
    legend = "".join(
        f'<span class="key"><span class="swatch" style="background:{PART_COLOURS[p]}"></span>'
        f"{html_text(PART_LABELS[p])}</span>"
        for p in PARTS
    )
    return _table(
        ["#", "state", "timeline (to scale)", "waiting ms", "restore ms", "prefill ms", "first token ms",
         "decode ms", "prefill ms/token", "decode ms/token", "decode/prefill"],
        rows, "nllnnnnnnnn", cls="timeline-table",
    ) + f'<div class="legend">{legend}</div>'


def _what_if(r: SessionReport) -> str:
    if not r.what_if:
        return "<p>No price profiles were given.</p>"
    header = ["", *(html_text(h) for h in words.what_if_header(r.what_if, r.priced_with))]
    columns = words.what_if_columns(r.what_if)
    rows = [[html_text(label), *(html_text(col[i]) for col in columns)]
            for i, label in enumerate(words.WHAT_IF_ROWS)]
    note = words.priced_with_note(r)
    return _table(header, rows, "l" + "n" * len(columns), cls="what-if") + (
        f'<p class="note">{html_text(note)}</p>' if note else ""
    )


def _turn_table(r: SessionReport) -> str:
    rows = [words.turn_row(v, html_text) for v in r.turns]
    notes = [note for v in r.turns for note in words.turn_notes(v, html_text)]
    numeric = "".join("l" if i in words.TURN_TEXT_COLUMNS else "n" for i in range(len(words.TURN_HEADER)))
    table = _table(words.TURN_HEADER, rows, numeric, cls="turns")
    return table + ("<ul>" + "".join(f"<li>{n}</li>" for n in notes) + "</ul>" if notes else "")
