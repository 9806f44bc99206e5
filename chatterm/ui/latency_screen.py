"""The latency screen (F5) and a turn's detail (F8, or Enter on a turn).

Contract:
- `LatencyScreen(turns, prices)` charts a conversation's turns with real axes
  and labels (textual-plotext): time to first token per turn stacked by waiting /
  restore / prefill / first token, decode tokens/s per turn, cumulative cost; a turns table
  (Enter opens `TurnDetailScreen`); and the session's cost split and what-if
  under every price profile. One tab per view, so each chart gets the whole
  screen at 80x24. A snapshot: it shows the turns it was given.
- The tab bar has the focus on open (left/right switch tabs) and 1-5 switch
  tabs from anywhere on the screen; the Turns tab focuses its table, so Enter
  opens the highlighted turn at once.
- The cost chart marks each turn's point (`●`) on its line, so a single turn
  is visible.
- Chart axes have round ticks (1, 2, 2.5 or 5 times a power of ten, as many
  decimals as the step needs); a few turns get narrow bars, not the whole
  width; the part legend is a line under the chart, never drawn over the bars.
- A turn with no first token gets no bar: its x label is marked `✕`, a stopped
  turn's `■`, so failures never read as zeros. Chart labels are turn numbers and
  fixed words only (plotext output is parsed as ANSI); chart colours come from the
  app's theme and follow a theme change.
- `TurnDetailScreen(index, metrics)` (F8 for the last turn: F6 and F7 select
  text in the prompt) shows one turn's timeline to scale with the ms and share
  of each part, the measured per-token costs (or why not), tokens, cache and
  cost split. Stored text (errors, cache details) is shown literally.
- Every figure comes from `chatterm.core.metrics.timeline` / `whatif`; nothing is
  computed here.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.color import Color
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import DataTable, Static, TabbedContent, TabPane, Tabs
from textual_plotext import PlotextPlot

from chatterm.core.config.catalog import PriceProfile
from chatterm.core.metrics.format import (
    SEP,
    cache_label,
    counted,
    fmt_int,
    fmt_ms,
    fmt_tok_s,
    fmt_usd,
    input_breakdown,
    printable,
)
from chatterm.core.metrics.timeline import PART_LABELS, TTFT_PARTS, Timeline, session_token_costs, timeline, token_costs
from chatterm.core.metrics.turn_metrics import StopReason, TurnMetrics
from chatterm.core.metrics.whatif import cost_split, priced_with, what_if
from chatterm.core.report.svg_charts import nice_ticks, tick_label
from chatterm.ui.key_footer import KeyFooter
from chatterm.ui.row_table import RowTable
from chatterm.ui.timeline import STYLES, fmt_share, per_token, timeline_bar, timeline_legend, token_cost_line

MARKS = {"error": "✕", "stopped": "■"}
PART_THEME_COLOURS = {"waiting": "secondary", "restore": "warning", "shift": "error", "prefill": "primary",
                      "first_token": "accent", "decode": "success"}
TABS = ("tab-ttft", "tab-decode", "tab-cost", "tab-turns", "tab-costs")
MIN_SLOTS = 8
"""The x axis has room for at least this many turns, so one turn is a bar, not a wall."""
POINT = "●"
"""The cost chart's mark for each turn (plotext takes any single character)."""


def restore_cell(tl: Timeline) -> str:
    """The Turns table's restore: its time, or a restore made before the turn
    was sent (the footer's "restored 22 ms"), which "0 ms" hid."""
    if tl.switch_restore_ms and not tl.restore_ms:
        return f"{fmt_ms(tl.switch_restore_ms)} before"
    return fmt_ms(tl.restore_ms)


def turn_label(index: int, m: TurnMetrics) -> str:
    """The x label: the turn number, marked when the turn failed or was stopped."""
    return f"{index}{MARKS.get(timeline(m).status, '')}"


def part_legend() -> Content:
    """The TTFT chart's parts in their chart colours (plotext's own legend would
    be drawn over the bars)."""
    return Content(" ").join(
        Content.assemble(("██", STYLES[p]), f" {PART_LABELS[p]} ") for p in TTFT_PARTS
    )


class LatencyScreen(Screen[None]):
    BINDINGS = [
        Binding("escape,q,f5", "app.pop_screen", "Close"),
        # One footer entry for all the tab keys: the focused tab bar's own
        # left/right bindings would hide separate ones.
        Binding("1", "show_tab(0)", "Tab", key_display="1-5 ←→"),
        *(Binding(str(n + 1), f"show_tab({n})", show=False) for n in range(1, len(TABS))),
        Binding("left", "step_tab(-1)", show=False),
        Binding("right", "step_tab(1)", show=False),
    ]
    AUTO_FOCUS = "#latency-tabs Tabs"
    DEFAULT_CSS = """
    LatencyScreen {
        background: $background;
        #latency-title { height: 1; padding: 0 1; background: $panel; text-style: bold; }
        #latency-summary { height: auto; padding: 0 1; color: $text-muted; }
        TabbedContent { height: 1fr; }
        TabPane { padding: 0; }
        PlotextPlot { height: 1fr; }
        .chart-note { height: auto; padding: 0 1; color: $text-muted; }
        #latency-turns { height: 1fr; }
        #latency-costs { padding: 0 1; }
    }
    """

    def __init__(self, turns: Sequence[TurnMetrics], prices: Mapping[str, PriceProfile]):
        super().__init__()
        self._turns = list(turns)
        self._prices = dict(prices)

    def compose(self):
        yield Static(Content(f"Latency · {counted(len(self._turns), 'turn')}"),
                     id="latency-title")
        costs = session_token_costs(self._turns)
        yield Static(Content(f"per token on this machine: {token_cost_line(costs)}"), id="latency-summary")
        notes = f"{MARKS['error']} no first token (failed){SEP}{MARKS['stopped']} stopped"
        with TabbedContent(id="latency-tabs"):
            with TabPane("TTFT", id="tab-ttft"):
                yield PlotextPlot(id="plot-ttft")
                yield Static(part_legend(), classes="chart-note", id="ttft-legend")
                yield Static(Content(f"stacked from the bottom{SEP}{notes}"), classes="chart-note")
            with TabPane("Decode", id="tab-decode"):
                yield PlotextPlot(id="plot-decode")
                yield Static(Content(f"no bar: fewer than 2 tokens{SEP}{notes}"), classes="chart-note")
            with TabPane("Cost", id="tab-cost"):
                yield PlotextPlot(id="plot-cost")
            with TabPane("Turns", id="tab-turns"):
                yield RowTable(id="latency-turns", zebra_stripes=True)
                # At 80 columns the last columns are out of view, and nothing said how to reach them.
                yield Static(Content(f"Enter opens a turn{SEP}← → scroll the columns{SEP}restore \"before\": "
                                     "done at the switch or while the message was typed, not in the TTFT"),
                             classes="chart-note")
            with TabPane("What if", id="tab-costs"):
                with VerticalScroll():
                    yield Static(self._costs(), id="latency-costs")
        yield KeyFooter()

    def on_mount(self) -> None:
        self._fill_table()
        self._draw()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self._draw())

    # -- tabs -----------------------------------------------------------------
    def action_show_tab(self, index: int) -> None:
        self.query_one(TabbedContent).active = TABS[index]

    def action_step_tab(self, step: int) -> None:
        active = self.query_one(TabbedContent).active
        self.action_show_tab((TABS.index(active) + step) % len(TABS))

    @on(TabbedContent.TabActivated, "#latency-tabs")
    def _tab_shown(self, event: TabbedContent.TabActivated) -> None:
        # The Turns tab is a list to pick from: its table takes the keys.
        if event.pane.id == "tab-turns":
            self.query_one("#latency-turns", DataTable).focus()
        elif not isinstance(self.focused, Tabs):
            self.query_one("#latency-tabs Tabs", Tabs).focus()

    # -- charts ---------------------------------------------------------------
    def _rgb(self, part: str) -> tuple[int, int, int]:
        value = self.app.theme_variables.get(PART_THEME_COLOURS[part], "#4e79a7")
        return Color.parse(value).rgb

    def _axes(self, plt, top: float) -> None:
        """Round y ticks from 0 past `top`, and room for at least MIN_SLOTS turns."""
        ticks = nice_ticks(top * 1.05)
        step = ticks[1] - ticks[0]
        plt.ylim(0, ticks[-1])
        plt.yticks(ticks, [tick_label(t, step) for t in ticks])
        plt.xlim(0.5, max(len(self._turns), MIN_SLOTS) + 0.5)

    def _draw(self) -> None:
        labels = [turn_label(i, m) for i, m in enumerate(self._turns, start=1)]
        xs = list(range(1, len(self._turns) + 1))
        timelines = [timeline(m) for m in self._turns]
        # An empty frame alone read as a drawing fault.
        none_yet = "" if xs else " · no turns yet"

        plt = self.query_one("#plot-ttft", PlotextPlot).plt
        plt.clear_figure()
        if xs:
            plt.stacked_bar(
                labels,
                [[tl.ms(part) for tl in timelines] for part in TTFT_PARTS],
                color=[self._rgb(p) for p in TTFT_PARTS],
                width=0.6,
            )
            self._axes(plt, max(sum(tl.ms(p) for p in TTFT_PARTS) for tl in timelines))
        plt.title(f"Time to first token per turn{none_yet}")
        plt.xlabel("turn")
        plt.ylabel("ms")

        plt = self.query_one("#plot-decode", PlotextPlot).plt
        plt.clear_figure()
        if xs:
            rates = [m.decode_tok_s or 0.0 for m in self._turns]
            plt.bar(labels, rates, color=self._rgb("decode"), width=0.6)
            self._axes(plt, max(rates))
        plt.title(f"Decode rate per turn{none_yet}")
        plt.xlabel("turn")
        plt.ylabel("tokens/s")

        plt = self.query_one("#plot-cost", PlotextPlot).plt
        plt.clear_figure()
        running, cumulative = 0.0, []
        for m in self._turns:
            running += m.cost_usd
            cumulative.append(running)
        if xs:
            # A mark on every turn: a line alone draws one turn as a quarter block.
            if len(xs) > 1:
                plt.plot(xs, cumulative, marker="hd", color=self._rgb("prefill"))
            plt.scatter(xs, cumulative, marker=POINT, color=self._rgb("prefill"))
            plt.xticks(xs, labels)
            self._axes(plt, cumulative[-1])
        plt.title(f"Cumulative cost (API-equivalent){none_yet}")
        plt.xlabel("turn")
        plt.ylabel("USD")
        for plot in self.query(PlotextPlot):
            plot.refresh()

    # -- tables ---------------------------------------------------------------
    def _fill_table(self) -> None:
        table = self.query_one("#latency-turns", DataTable)
        # The headline figures (TTFT, cost) first, then TTFT's parts and the rates:
        # at 80 columns the last ones scroll out of view (the cost did).
        table.add_columns("#", "state", "TTFT", "cost", "wait", "restore", "prefill", "1st tok", "decode", "tok/s",
                          "ms/tok in", "ms/tok out", "ratio")
        for index, m in enumerate(self._turns, start=1):
            tl, c = timeline(m), token_costs(m)
            ratio = f"{c.ratio:,.1f}x" if c.ratio is not None else "–"
            cells = [
                turn_label(index, m), tl.status, fmt_ms(m.ttft_ms), fmt_usd(m.cost_usd), fmt_ms(tl.waiting_ms),
                restore_cell(tl), fmt_ms(tl.prefill_ms), fmt_ms(tl.first_token_ms) if tl.reached_first_token else "–",
                fmt_ms(tl.decode_ms), fmt_tok_s(m.decode_tok_s).removesuffix(" tok/s"),
                per_token(c.prefill_ms_per_token, c.prefill_note, ""),
                per_token(c.decode_ms_per_token, c.decode_note, ""),
                ratio,
            ]
            table.add_row(*(Text(cell, justify="left" if i == 1 else "right") for i, cell in enumerate(cells)),
                          key=str(index))

    def _costs(self) -> Group | Content:
        if not self._turns:
            return Content("No turns yet.")
        split = cost_split(self._turns)
        grid = Table(title="Where the money went", title_justify="left", box=box.SIMPLE_HEAD)
        for name in ("", "tokens", "USD"):
            grid.add_column(name, justify="right" if name else "left")
        grid.add_row("input, uncached", fmt_int(split.uncached_tokens), fmt_usd(split.uncached_usd))
        grid.add_row("input, cached", fmt_int(split.cached_tokens), fmt_usd(split.cached_usd))
        grid.add_row("output", fmt_int(split.output_tokens), fmt_usd(split.output_usd))
        share = split.input_token_share, split.input_cost_share
        note = f"input share: {fmt_share(share[0])} of tokens, {fmt_share(share[1])} of cost"
        if split.switch_tokens:
            note += f"{SEP}uncached includes {fmt_int(split.switch_tokens)} prefilled with the persona"
        share_note = Text(note, style="dim")
        rows = what_if(self._turns, self._prices)
        own = priced_with(self._turns)
        # Totals only, so the table fits 80 columns; the reports split each profile's cost.
        table = Table(title="What if: this session under every price profile", title_justify="left",
                      box=box.SIMPLE_HEAD)
        table.add_column("profile")
        for name in ("total", "without cache", "cache saved", "input share"):
            table.add_column(name, justify="right")
        for w in rows:
            label = Text(printable(f"{w.profile.label}{' *' if w.profile.id in own else ''}"))
            table.add_row(label, fmt_usd(w.total_usd), fmt_usd(w.without_cache_usd),
                          fmt_usd(w.saved_usd) if w.has_cache_discount else "no discount",
                          fmt_share(w.split.input_cost_share))
        # The notes are lines of their own, not table captions: a caption wraps at
        # its table's width (about 40 columns) whatever the screen's width.
        table_note = Text("* the profile this session is priced at · USD, API-equivalent · export md/html for "
                          "the split", style="dim")
        return Group(grid, share_note, Text(""), table, table_note)

    @on(DataTable.RowSelected, "#latency-turns")
    def _open_turn(self, event: DataTable.RowSelected) -> None:
        index = int(event.row_key.value)
        self.app.push_screen(TurnDetailScreen(index, self._turns[index - 1]))


class TurnDetailScreen(ModalScreen[None]):
    """One turn: where its time went, what a token cost, where its money went."""

    BINDINGS = [Binding("escape,q,f8", "dismiss", "Close")]
    AUTO_FOCUS = None
    DEFAULT_CSS = """
    TurnDetailScreen {
        align: center middle;
        #turn-box { width: 90%; max-width: 100; height: auto; max-height: 90%;
                    border: round $primary; background: $surface; padding: 0 1; }
        #turn-title { text-style: bold; color: $primary; }
        #turn-bar { height: 1; margin: 1 0 0 0; }
        .turn-hint { color: $text-muted; }
    }
    """

    def __init__(self, index: int, metrics: TurnMetrics):
        super().__init__()
        self._index = index
        self._m = metrics

    def compose(self):
        m = self._m
        tl, costs = timeline(m), token_costs(m)
        state = tl.status if tl.reached_first_token else f"{tl.status}: no first token"
        with Vertical(id="turn-box"):
            yield Static(Content(f"Turn {self._index}{SEP}{state}{SEP}TTFT {fmt_ms(m.ttft_ms)}"), id="turn-title")
            yield TimelineBar(tl, id="turn-bar")
            yield Static(timeline_legend(tl), id="turn-legend")
            yield Static(Content(self._details(costs)), id="turn-details")
            yield Static(Content("Esc closes"), classes="turn-hint")

    def _details(self, costs) -> str:
        m = self._m
        lines = [f"per token: {token_cost_line(costs)}"]
        for note in (costs.prefill_note, costs.decode_note):
            if note:
                lines.append(f"  {note}")
        approx = "~" if m.tokens_estimated else ""
        before = input_breakdown(m)
        why = "stopped" if m.stop_reason == StopReason.CANCELLED else "failed"
        unreached = f", {fmt_int(m.unreached_tokens)} not reached: {why}" if m.unreached_tokens else ""
        lines.append(
            f"tokens: {approx}{fmt_int(m.prompt_tokens)} prompt ({before + ', ' if before else ''}"
            f"{fmt_int(m.prefilled_tokens)} prefilled{unreached}){SEP}{approx}{fmt_int(m.generated_tokens)} generated"
        )
        lines.append(f"decode: {fmt_tok_s(m.decode_tok_s)}{SEP}total {fmt_ms(m.total_ms)}")
        if m.seed is not None:
            # One line at 80 columns for a 10-digit seed.
            lines.append(f"seed {m.seed}{SEP}`seed = {m.seed}` in the persona repeats it")
        lines.append(f"cache: {cache_label(m)}" + (f"{SEP}{m.cache_detail}" if m.cache_detail else ""))
        lines.append(
            f"cost: {fmt_usd(m.cost_usd)} = input {fmt_usd(m.cost_input_usd)} + cached "
            f"{fmt_usd(m.cost_cached_input_usd)} + output {fmt_usd(m.cost_output_usd)}"
            + (f" ({printable(m.price_profile)})" if m.price_profile else "")
        )
        if m.error:
            lines.append(f"error: {m.error}")
        return printable("\n".join(lines))


class TimelineBar(Widget):
    """The turn's timeline, as wide as the widget, to the turn's own scale."""

    DEFAULT_CSS = "TimelineBar { height: 1; }"

    def __init__(self, tl: Timeline, **kwargs):
        super().__init__(**kwargs)
        self._tl = tl

    def render(self) -> Content:
        return timeline_bar(self._tl, max(self.content_size.width, 1))
