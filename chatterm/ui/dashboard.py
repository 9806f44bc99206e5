"""The latency dashboard: current turn, session, history sparklines, persona, model.

Contract:
- The figures watched most stay in view however tall the terminal and wherever
  the panel is scrolled: context used, TTFT and decode rate are a headline
  docked at the top (`#dash-now`); the sections below it scroll. A line docked
  at the bottom (`#dash-hint`) says when more is below and how to reach it, and
  marks the panel while it has the focus (with its accent edge).
- The context figure describes the conversation on screen (`show_context`,
  which the chat calls on every change, live while a reply streams); the
  engine's own count (`show_model`) stands in only while the chat does not know
  it (the persona's prompt not measured yet).
- The app calls the `show_*` methods from timers and message handlers (4-10 Hz
  while a reply streams, never per token). Each section is one `Static` of
  `Rows` (label column fixed, values wrap under themselves, nothing cut),
  updated without layout when its size is unchanged (about 1-2 ms measured); sparklines
  get new data only when a turn ends.
- It formats, it does not compute: every figure comes from `TurnMetrics`,
  `SessionSummary`, `DeviceInfo`, `PrefixReport`, `GpuStatus` or the core's
  breakdowns (`chatterm.core.metrics.timeline`: the turn's timeline drawn to scale and
  per-token costs; `chatterm.core.metrics.whatif`: the input share) and is worded by
  `chatterm.core.metrics.format` / `chatterm.ui.timeline`. Missing values (no GPU, no
  power reading, no turn yet, too few tokens) read "n/a", "–" or say why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.widgets import Sparkline, Static

from chatterm.core.metrics.format import ahead_line, cache_label, fmt_int, fmt_ms, fmt_recent_time, fmt_tok_s, fmt_usd
from chatterm.core.metrics.timeline import PART_GLYPHS, PARTS, session_token_costs, timeline, token_costs
from chatterm.core.metrics.turn_metrics import CacheOutcome, SessionSummary, StopReason, TurnMetrics
from chatterm.core.metrics.whatif import cost_split, switch_tokens
from chatterm.ui.fit_text import first_fitting
from chatterm.ui.rows import LABEL_WIDTH, Fitted, Rows
from chatterm.ui.timeline import STYLES, fmt_share, shown, timeline_bar, token_cost_line
from chatterm.ui.typing_to_prompt import TypingGoesToPrompt

if TYPE_CHECKING:
    from chatterm.core.engine.interface import DeviceInfo
    from chatterm.core.system.gpu import GpuStatus

BAR_WIDTH = 30
"""Cells of the turn's timeline bar where the panel has them (48 columns wide);
narrower (at 80 columns it is 40), the bar shrinks to its column."""
NA = "n/a"


def timeline_rows(m: TurnMetrics) -> list[tuple[str, Content | Fitted]]:
    """The turn's bar to scale and a compact legend: `┄ 900 ▒ 21 █ 61 ▓ 6 ░ 96 ms`
    (waiting and restore only when they took time). The bar is `Fitted` to its
    column: wrapped, it would no longer be to scale."""
    tl = timeline(m)
    if not tl.reached_first_token:
        return []
    legend = Content(" ").join(
        Content.assemble((PART_GLYPHS[p], STYLES[p]), f" {tl.ms(p):,.0f}")
        for p in PARTS if shown(tl, p)
    )
    return [("timeline", lambda width: timeline_bar(tl, min(width, BAR_WIDTH))), ("", legend + Content(" ms"))]


def turn_state(m: TurnMetrics, running: bool) -> str:
    if running:
        return "prefilling…" if m.ttft_ms is None else "streaming…"
    return {
        StopReason.CANCELLED: "stopped", StopReason.ERROR: "error", StopReason.LENGTH: "max tokens",
        StopReason.CONTEXT: "context full", StopReason.EOS: "done",
    }.get(m.stop_reason, str(m.stop_reason) or "done")


class _FromZero(SparklineRenderable):
    """Textual's sparkline renderable with zero as the floor of its scale.

    It scales from `min(data)` to `max(data)` and has no option for the floor
    (Textual 8.2): a 0 put in front of the data makes zero the minimum, and
    `_buckets`, which the bars are drawn from, leaves it out again, so the bars
    are the data's alone. `_buckets` is private: tests/ui check the glyphs, so
    a change in Textual's renderable shows there."""

    def __init__(self, data: Sequence[float], **kwargs) -> None:
        super().__init__([0.0, *data] if data else data, **kwargs)

    @classmethod
    def _buckets(cls, data: list[float], num_buckets: int):
        return super()._buckets(data[1:], num_buckets)


class ZeroSparkline(Sparkline):
    """A `Sparkline` to scale from zero, one cell per value: TTFTs of 189, 199
    and 219 ms draw as ▇▇█, not ▁▃█, which made a 16 % difference look like a
    tenfold one, and one turn is one bar (Textual stretches the data over the
    whole width: one turn filled every cell). More values than cells share
    cells (the highest of each shows). No data draws `–`, not a flat line."""

    def render(self):
        if not self.data:
            return Content("–")
        stock = super().render()  # Textual's own, with the theme's colours resolved
        # Another Textual (within the pinned range) may draw its sparkline
        # differently: then its own scale, never a crash or a stray zero bar.
        if not isinstance(stock, SparklineRenderable) or not hasattr(SparklineRenderable, "_buckets"):
            return stock
        try:
            return _FromZero(
                stock.data, width=min(stock.width or len(stock.data), len(stock.data)), height=stock.height,
                min_color=stock.min_color.color, max_color=stock.max_color.color,
                summary_function=stock.summary_function,
            )
        except (AttributeError, TypeError):
            return stock


CONTEXT_WARNING = 0.8
"""The share of the context at which the headline warns that it is filling."""
HINT_FOCUSED = ("▶ dashboard · ↑↓ PgUp PgDn Home End scroll · Tab leaves", "▶ dashboard · ↑↓ PgUp PgDn · Tab leaves",
                "▶ ↑↓ PgUp PgDn · Tab leaves")
HINT_MORE = ("↓ more below · Tab to here, then ↓ or PgDn", "↓ more below · Tab, then ↓ PgDn")
HINT_ABOVE = ("↑ more above · Tab to here, then ↑ Home", "↑ more above · Tab, then ↑ Home")
HINT_BOTH = ("↑↓ more above and below · Tab to here", "↑↓ more above and below")
"""Each longest first: the panel is 38 cells wide at 80 columns (F4), less its
scrollbar when it scrolls."""


class Dashboard(TypingGoesToPrompt, VerticalScroll):
    # Focusable (Tab) so the keyboard can scroll it: at 80x24 most of it is
    # below the fold. It never takes the focus by itself.
    can_focus = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._lines: dict[str, int] = {}
        self._now: TurnMetrics | None = None
        self._now_running = False
        self._chat_context: int | None = None
        """The conversation's tokens in the context (`show_context`); None: unknown."""
        self._persona_alone = False
        """`_chat_context` is the persona's prompt alone (no turn yet)."""
        self._engine_context: int | None = None
        self._n_ctx: int | None = None

    def compose(self):
        yield Static(self._now_rows(), id="dash-now")
        yield Static(Content(""), id="dash-hint")
        yield Static(Content("Turn"), classes="title")
        yield Static(Rows([("state", "no turn yet")]), id="dash-turn")
        ahead = Static(Content(""), id="dash-ahead")
        ahead.display = False
        yield ahead
        yield Static(Content("Session"), classes="title")
        yield Static(Rows([("turns", "0")]), id="dash-session")
        yield Static(Content("History (one bar per turn)"), classes="title")
        with Horizontal(classes="spark-row"):
            yield Static(Content("TTFT".ljust(LABEL_WIDTH)), classes="spark-label")
            yield ZeroSparkline([], id="spark-ttft")
        with Horizontal(classes="spark-row"):
            yield Static(Content("tok/s".ljust(LABEL_WIDTH)), classes="spark-label")
            yield ZeroSparkline([], id="spark-rate")
        yield Static(Content("Persona"), classes="title")
        yield Static(Rows([("persona", "–")]), id="dash-persona")
        yield Static(Content("Model"), classes="title")
        yield Static(Rows([("model", "loading…")]), id="dash-model")

    # -- the headline and the hint ------------------------------------------------
    def _now_rows(self) -> Rows:
        used = self._chat_context if self._chat_context is not None else self._engine_context
        context: str | Content = fmt_int(used)
        if self._n_ctx:
            context += f" / {fmt_int(self._n_ctx)}"
            if used is not None and used >= self._n_ctx and self._persona_alone:  # no room for any turn
                context = Content.assemble(context, (" · more than the context holds", "$error"))
            elif used is not None and used >= self._n_ctx:
                # A reply that ran to the end of the context, or turns counted on
                # a model with a larger one: the next prompt is cut to fit.
                context = Content.assemble(context, (" · full: the oldest turns leave next", "$warning"))
            elif used is not None:
                share = used / self._n_ctx
                context += f" · {share * 100:.0f} %"
                if share >= CONTEXT_WARNING:
                    # Said before it happens: the next turns leave the oldest out.
                    context = Content.assemble(context, (" · nearly full: the oldest turns leave next", "$warning"))
        m = self._now
        if m is None:
            ttft, decode = "–", "–"
        else:
            ttft = fmt_ms(m.ttft_ms) if m.ttft_ms is not None or not self._now_running else "prefilling…"
            decode = fmt_tok_s(m.decode_tok_s)
        return Rows([("context", context), ("TTFT", ttft), ("decode", decode)])

    def _show_now(self, live: bool = False) -> None:
        self._set("dash-now", self._now_rows(), live=live)

    def show_context(self, used: int | None, *, persona_alone: bool = False) -> None:
        """Tokens the conversation on screen holds in the context: its persona's
        prompt, its turns and, while a reply streams, that turn's prompt and
        what it generated so far (`persona_alone`: the persona's prompt, no turn
        yet). None: not known yet; the engine's count stands in from its next
        `show_model` (the one before describes another conversation)."""
        if used is None:
            self._engine_context = None
        if used != self._chat_context or used is None or persona_alone != self._persona_alone:
            self._chat_context, self._persona_alone = used, persona_alone
            self._show_now(live=True)

    def _update_hint(self) -> None:
        for hint in self.query("#dash-hint").results(Static):  # none while the app closes
            # Scrolled, the sections above are hidden too (the Turn heading).
            above, below = self.scroll_y > 0, self.scroll_y < self.max_scroll_y
            if self.has_focus:
                text = first_fitting(HINT_FOCUSED, hint.content_size.width)
            elif above or below:
                hints = HINT_BOTH if above and below else HINT_ABOVE if above else HINT_MORE
                text = first_fitting(hints, hint.content_size.width)
            else:
                text = ""
            hint.update(Content(text), layout=False)
            hint.set_class(self.has_focus, "-focused")

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._update_hint()

    def watch_virtual_size(self) -> None:
        self.call_after_refresh(self._update_hint)

    def on_resize(self) -> None:
        self.call_after_refresh(self._update_hint)

    # After the event: a subclass's handler runs before Widget's own, which is
    # what sets `has_focus`.
    def on_focus(self) -> None:
        self.call_later(self._update_hint)

    def on_blur(self) -> None:
        self.call_later(self._update_hint)

    # -- the sections ------------------------------------------------------------------
    def _set(self, widget_id: str, content: Rows, live: bool = False) -> None:
        # A live update (5 Hz while streaming) skips layout unless its number of
        # lines at the widget's width changed: a same-size update repaints one
        # widget (about 1 ms) instead of re-laying out the panel. Rare updates
        # always lay out.
        widget = self.query_one(f"#{widget_id}", Static)
        lines = content.get_height({}, widget.content_size.width)
        relayout = not live or self._lines.get(widget_id) != lines
        self._lines[widget_id] = lines
        widget.update(content, layout=relayout)

    def show_turn(self, m: TurnMetrics | None, running: bool = False, stored: bool = False) -> None:
        """The turn on screen (None: a new conversation, no turn yet). Its TTFT
        and decode rate are in the headline, the rest in the Turn section.
        `stored`: a resumed session's last turn, read from the store, so its
        state says when it ran."""
        self._now, self._now_running = m, running
        self._show_now(live=running)
        if m is None:
            self._set("dash-turn", Rows([("state", "no turn yet")]))
            return
        state = turn_state(m, running)
        if stored:
            state += f" · stored turn from {fmt_recent_time(m.submitted_at)}"  # one line at 80 columns
        pairs = [
            ("state", state),
            *timeline_rows(m),
            ("prefill", fmt_ms(m.prefill_ms) if m.ttft_ms is not None else "…"),
            ("per token", token_cost_line(token_costs(m)) if not running else "…"),
            ("prompt", fmt_int(m.prompt_tokens)),
            # Reused from earlier prompts, as the cost and the what-if count them;
            # what was prefilled while typing is a row of its own.
            *([("persona", fmt_int(switch_tokens(m)))] if m.cache_outcome == CacheOutcome.SWITCH
              else [("cached", fmt_int(m.reused_tokens))]),
            *([("typed ahead", ahead_line(m))] if m.ahead_tokens else []),
            ("prefilled", fmt_int(m.prefilled_tokens)),
            ("generated", fmt_int(m.generated_tokens)),
            ("cache", cache_label(m) if m.prompt_tokens or not running else "–"),
            ("cost", fmt_usd(m.cost_usd) if not running else "…"),
        ]
        if m.energy_wh is not None:
            pairs.append(("energy", f"{m.energy_wh:.3f} Wh"))
        if m.error:
            pairs.append(("error", m.error))
        self._set("dash-turn", Rows(pairs), live=running)

    def show_session(self, turns: Sequence[TurnMetrics], path_turns: int) -> None:
        """The session's figures: over every turn computed, `path_turns` of them the exchanges shown."""
        summary = SessionSummary.of(turns)
        split = cost_split(turns)
        other = summary.turns - path_turns  # regenerated or edited away from the path shown
        pairs = [
            ("turns", f"{fmt_int(path_turns)} (+{fmt_int(other)} on other branches)" if other > 0
             else fmt_int(summary.turns)),
            ("TTFT p50", fmt_ms(summary.ttft_p50_ms)),
            ("TTFT p95", fmt_ms(summary.ttft_p95_ms)),
            ("mean rate", fmt_tok_s(summary.mean_decode_tok_s)),
            ("tokens", f"{fmt_int(summary.prompt_tokens)} in · {fmt_int(summary.generated_tokens)} out"),
            ("per token", token_cost_line(session_token_costs(turns))),
            ("total cost", fmt_usd(summary.cost_usd)),
            ("input share",
             f"{fmt_share(split.input_token_share)} of tokens · {fmt_share(split.input_cost_share)} of cost"),
            ("cache saved", f"{summary.saved_prefill_s:,.2f} s prefill · {fmt_usd(summary.saved_usd)}"),
        ]
        if summary.energy_wh is not None:
            pairs.append(("energy", f"{summary.energy_wh:.3f} Wh"))
        self._set("dash-session", Rows(pairs))
        self.query_one("#spark-ttft", Sparkline).data = [
            t.ttft_ms for t in turns if t.ttft_ms is not None
        ]
        self.query_one("#spark-rate", Sparkline).data = [
            rate for t in turns if (rate := t.decode_tok_s) is not None
        ]

    def show_type_ahead(self, ready: int | None, total: int | None) -> None:
        """How much of the draft's prompt is prefilled ahead (None: nothing)."""
        widget = self.query_one("#dash-ahead", Static)
        if ready is None or total is None:
            widget.display = False
            return
        widget.display = True
        widget.update(Rows([("type-ahead", f"{fmt_int(ready)} of {fmt_int(total)} tokens ready")]))

    def show_persona(self, name: str, state: str) -> None:
        self._set("dash-persona", Rows([("persona", name), ("prefix", state)]))

    def show_model(
        self,
        label: str,
        device: "DeviceInfo | None",
        context_used: int | None,
        gpu: "GpuStatus | None",
        status: str = "",
    ) -> None:
        """The model section; `context_used` is the engine's count, shown in the
        headline only while the conversation's own is unknown (`show_context`)."""
        self._engine_context = context_used
        self._n_ctx = device.n_ctx if device is not None else None
        self._show_now()
        pairs = [("model", label)]
        if status:
            pairs.append(("status", status))
        if device is not None:
            pairs.append(("device", f"{device.backend} · {device.name}"))
            if device.n_layers is not None:
                pairs.append(("layers", f"{fmt_int(device.layers_offloaded or 0)}/{fmt_int(device.n_layers)} on GPU"))
            flash = {True: "flash attn on", False: "flash attn off"}.get(device.flash_attn, "")
            pairs.append(("KV", " · ".join(p for p in (device.kv_type or "–", flash) if p)))
            if device.threads:
                pairs.append(("threads", device.threads))
            if device.overflow:
                pairs.append(("overflow", device.overflow))
            pairs += [("note", note) for note in device.notes]
        if gpu is not None:
            pairs.append(("GPU", gpu.name))
            pairs.append(("GPU mem", f"{gpu.memory_used_mb:,.0f} / {gpu.memory_total_mb:,.0f} MiB"))
            pairs.append(("power", f"{gpu.power_w:,.0f} W" if gpu.power_w is not None else NA))
        else:
            pairs.append(("GPU mem", NA))
            pairs.append(("power", NA))
        self._set("dash-model", Rows(pairs))
