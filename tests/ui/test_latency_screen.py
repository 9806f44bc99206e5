"""Pilot tests of the latency screen (F5), the turn detail (F8 / Enter) and the
dashboard's timeline, at 80x24 and 120x40, on the scripted engine (layout only:
the figures themselves are tested on the real model in tests/core/report/test_report.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from pilot_steps import loaded, send, wait_for
from textual.color import Color
from textual.widgets import DataTable, Static, TabbedContent
from textual_plotext import PlotextPlot

from chatterm.core.metrics.timeline import PART_GLYPHS, timeline
from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.store.session_store import SessionStore
from chatterm.ui.latency_screen import POINT, LatencyScreen, TimelineBar, TurnDetailScreen
from chatterm.ui.timeline import timeline_bar, timeline_legend


def _inside(widget, size) -> bool:
    region = widget.region
    return region.width > 0 and region.x >= 0 and region.y >= 0 and \
        region.right <= size[0] and region.bottom <= size[1]


async def _three_turns(pilot, engine):
    await loaded(pilot)
    await send(pilot, "first question")
    await send(pilot, "second question")
    engine.fail_turn = "decode failed | [bold]x\x1b[31m"
    await send(pilot, "third question")
    engine.fail_turn = None


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_latency_screen_charts_turns_and_what_if(build, workspace, size):
    app, engines = build(replies=["One two three four five six seven", "Eight nine ten"])
    async with app.run_test(size=size) as pilot:
        await _three_turns(pilot, engines[0])
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        await pilot.pause()
        screen = app.screen
        tabs = screen.query_one(TabbedContent)

        ttft = screen.query_one("#plot-ttft", PlotextPlot)
        assert _inside(ttft, size)
        assert ttft.region.width >= size[0] - 2 and ttft.region.height >= 12
        text = ttft.render().plain
        assert "Time to first token per turn" in text and "turn" in text and "ms" in text
        assert "3✕" in text  # the failed turn is marked, not drawn as a zero
        # The part legend is a line of its own, never drawn over the bars.
        assert "restore" not in text and "prefill" not in text
        legend = str(screen.query_one("#ttft-legend", Static).render())
        assert "restore" in legend and "prefill" in legend and "first token" in legend

        for tab, plot_id, words in (
            ("tab-decode", "#plot-decode", ("Decode rate per turn", "tokens/s")),
            ("tab-cost", "#plot-cost", ("Cumulative cost", "USD")),
        ):
            tabs.active = tab
            await pilot.pause()
            plot = screen.query_one(plot_id, PlotextPlot)
            assert _inside(plot, size) and plot.region.height >= 12
            rendered = plot.render().plain
            assert all(w in rendered for w in words), rendered

        tabs.active = "tab-costs"
        await pilot.pause()
        costs = screen.query_one("#latency-costs", Static)
        assert _inside(costs.parent, size) and costs.region.right <= size[0]  # scrolls down, never sideways
        rendered = "\n".join(line.text for line in costs.render_lines(costs.region.reset_offset))
        for profile in workspace.catalog.prices.values():
            assert profile.label in rendered
        # The notes use the screen's width: not wrapped at the table's.
        assert any("input share:" in line and "of cost" in line for line in rendered.splitlines()), rendered
        if size[0] >= 120:
            assert any("priced at" in line and "the split" in line for line in rendered.splitlines()), rendered

        tabs.active = "tab-turns"
        await pilot.pause()
        table = screen.query_one(DataTable)
        assert table.row_count == 3
        assert str(table.get_row_at(2)[1]) == "error"
        # The cost in view without scrolling, at 80 columns too (it was cut at 100).
        labels = [str(c.label) for c in table.columns.values()]
        widths = [c.get_render_width(table) for c in table.columns.values()]
        assert sum(widths[: labels.index("cost") + 1]) <= table.scrollable_content_region.width
        table.focus()
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, TurnDetailScreen), what="the turn detail")
        await pilot.pause()
        detail = app.screen
        box = detail.query_one("#turn-box")
        assert _inside(box, size)
        assert "Turn 2" in str(detail.query_one("#turn-title", Static).render())
        assert "`seed = 1002` in the persona" in str(detail.query_one("#turn-details", Static).render())
        bar = detail.query_one(TimelineBar)
        assert bar.region.right <= box.region.right
        await pilot.press("escape")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, LatencyScreen), what="closing")


async def test_the_turns_table_shows_a_restore_made_before_the_turn(build):
    """A resumed turn's footer said "restored 22 ms" and F5's Turns table "0 ms"."""
    app, _ = build(store=None)
    resumed = TurnMetrics(engine="local", model_id="m", persona_id="assistant", submitted_at=1.7e9,
                          ttft_ms=85.0, restore_ms=21.8, restore_at_switch=True, prefill_ms=40.0,
                          prompt_tokens=613, cached_tokens=599, prefilled_tokens=14, generated_tokens=9,
                          cache_outcome="restored", stop_reason="eos")
    in_turn = dataclasses.replace(resumed, restore_at_switch=False)
    async with app.run_test(size=(150, 40)) as pilot:
        await loaded(pilot)
        # Made in the app's own context, as F5 makes it.
        app.call_later(lambda: app.push_screen(LatencyScreen([resumed, in_turn], app.workspace.catalog.prices)))
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        app.screen.query_one(TabbedContent).active = "tab-turns"
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        restore = [str(c.label) for c in table.columns.values()].index("restore")
        assert [str(table.get_row_at(i)[restore]) for i in range(2)] == ["22 ms before", "22 ms"]


async def test_last_turn_detail_shows_a_failure_literally(build):
    app, engines = build(replies=["One two three four"])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")  # nothing yet: a notice, no screen
        await _three_turns(pilot, engines[0])
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, TurnDetailScreen), what="the turn detail")
        await pilot.pause()
        title = str(app.screen.query_one("#turn-title", Static).render())
        details = str(app.screen.query_one("#turn-details", Static).render())
        assert "Turn 3" in title and "no first token" in title
        assert "[bold]x␛[31m" in details  # stored text shown literally
        assert "too few generated tokens" in details


async def test_a_single_turn_is_a_visible_point_on_the_cost_chart(build):
    app, _ = build(replies=["One two three four"])
    async with app.run_test(size=(150, 45)) as pilot:
        await loaded(pilot)
        await send(pilot, "a question")
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        await pilot.press("3")
        await pilot.pause()
        chart = app.screen.query_one("#plot-cost", PlotextPlot).render().plain
        assert chart.count(POINT) == 1, chart


async def test_the_latency_screen_before_any_turn_says_so(build):
    app, _ = build()
    async with app.run_test(size=(80, 24)) as pilot:
        await loaded(pilot)
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        await pilot.pause()
        # An empty frame alone read as a drawing fault.
        assert "no turns yet" in app.screen.query_one("#plot-ttft", PlotextPlot).render().plain


async def test_latency_charts_follow_the_theme(build):
    app, engines = build(replies=["One two three"])
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, "a question")
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        screen = app.screen
        for theme in ("chatterm-light", "chatterm-high-contrast"):
            app.theme = theme
            await pilot.pause()
            # The scripted turn's time is mostly its restore: drawn in the theme's warning colour.
            restore = Color.parse(app.theme_variables["warning"]).rgb
            rendered = screen.query_one("#plot-ttft", PlotextPlot).render()
            colours = {span.style.color.triplet for span in rendered.spans
                       if not isinstance(span.style, str) and span.style.color and span.style.color.triplet}
            assert tuple(restore) in {tuple(c) for c in colours}, theme


async def test_dashboard_shows_the_turn_timeline_and_per_token_costs(build):
    app, engines = build(replies=["One two three four five six seven eight"])
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, "a question that is long enough to prefill some tokens")
        turn = str(app.query_one("#dash-turn", Static).render())
        session = str(app.query_one("#dash-session", Static).render())
        assert "timeline" in turn and "per token" in turn and "▒" in turn
        assert "per token" in session and "input share" in session


async def test_html_export_from_the_app_has_the_charts_and_every_profile(build, workspace, isolated_dirs):
    store = SessionStore(workspace.db_path)
    app, engines = build(replies=["One two three four five"], store=store)
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        await send(pilot, "a question")
        app.action_export("html")
        target = isolated_dirs["CHATTERM_DATA_DIR"] / "exports" / f"session-{app.conversation.session_id}.html"
        await wait_for(pilot, target.exists, what="the HTML export")
    store.close()
    text = target.read_text(encoding="utf-8")
    assert 'id="chart-ttft"' in text and "<script" not in text
    for profile in workspace.catalog.prices.values():
        assert profile.label in text


def _y_ticks(plot: PlotextPlot) -> list[str]:
    """The y axis's tick labels as drawn (the text left of each `┤`)."""
    return [line.split("┤")[0].strip() for line in plot.render().plain.splitlines() if "┤" in line]


def _is_round_step(labels: list[str]) -> bool:
    """Evenly spaced from 0 by 1, 2, 2.5 or 5 times a power of ten, and no more
    decimals than that step needs."""
    values = sorted(float(v.replace(",", "")) for v in labels)
    step = values[1] - values[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    decimals = max(len(v.partition(".")[2]) for v in labels)
    return (values[0] == 0 and any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5))
            and all(math.isclose(b - a, step, rel_tol=1e-6) for a, b in zip(values, values[1:], strict=False))
            and decimals <= max(0, -math.floor(math.log10(step))) + 1)


async def test_latency_tabs_take_keys_at_once_and_ticks_are_round(build):
    app, engines = build(replies=["One two three four five six seven"])
    async with app.run_test(size=(100, 32)) as pilot:
        await loaded(pilot)
        await send(pilot, "one question")
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, LatencyScreen), what="the latency screen")
        await pilot.pause()
        screen = app.screen
        tabs = screen.query_one(TabbedContent)
        footer = {b.key_display or b.key: b.description for _, b, enabled, _ in app.active_bindings.values()
                  if b.show and enabled}
        assert footer.get("1-5 ←→") == "Tab"

        await pilot.press("right")  # no Tab first: the tab bar has the focus
        assert tabs.active == "tab-decode"
        await pilot.press("left", "left")
        assert tabs.active == "tab-costs"
        await pilot.press("3")
        assert tabs.active == "tab-cost"
        await pilot.press("4")
        await pilot.pause()
        assert tabs.active == "tab-turns" and isinstance(screen.focused, DataTable)
        await pilot.press("enter")  # the table has the keys: Enter opens the turn
        await wait_for(pilot, lambda: isinstance(app.screen, TurnDetailScreen), what="the turn detail")
        await pilot.press("escape")
        await pilot.press("1")
        await pilot.pause()
        assert tabs.active == "tab-ttft"

        for tab, plot_id in (("tab-ttft", "#plot-ttft"), ("tab-decode", "#plot-decode"), ("tab-cost", "#plot-cost")):
            tabs.active = tab
            await pilot.pause()
            plot = screen.query_one(plot_id, PlotextPlot)
            labels = _y_ticks(plot)
            assert len(labels) >= 3 and _is_round_step(labels), (plot_id, labels)

        # One turn is a bar, not the whole width of the chart.
        tabs.active = "tab-ttft"
        await pilot.pause()
        plot = screen.query_one("#plot-ttft", PlotextPlot)
        widest = max(line.count("█") for line in plot.render().plain.splitlines())
        assert 0 < widest <= plot.region.width // 4


async def test_a_turn_sent_while_the_persona_is_prepared_shows_its_wait(build):
    import threading

    gate = threading.Event()
    # The first use of the persona is still being prepared...
    app, engines = build(replies=["One two three four"], engine_kwargs={"prepare_gate": gate})
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        app.query_one("#prompt").insert("a question")
        await pilot.press("enter")  # ...when Enter is pressed
        await pilot.pause(0.3)
        gate.set()
        await wait_for(pilot, lambda: app.conversation.turns, what="the reply")
        (m,) = app.conversation.turns
        tl = timeline(m)
        # The wait is a part of its own, not "first token" time.
        assert m.wait_ms >= 300 and tl.waiting_ms == m.wait_ms
        assert tl.first_token_ms < tl.waiting_ms
        turn_panel = str(app.query_one("#dash-turn", Static).render())
        assert "┄" in turn_panel
        await pilot.press("f8")
        await wait_for(pilot, lambda: isinstance(app.screen, TurnDetailScreen), what="the turn detail")
        legend = str(app.screen.query_one("#turn-legend", Static).render())
        assert "waiting" in legend


def test_a_restore_at_the_persona_switch_is_drawn_apart_from_the_turn():
    m = TurnMetrics(engine="local", model_id="m", persona_id="p", submitted_at=0.0, cache_outcome="restored",
                    restore_ms=40.0, restore_at_switch=True, prefill_ms=50.0, ttft_ms=60.0, decode_ms=40.0,
                    generated_tokens=5, stop_reason="eos")
    tl = timeline(m)
    assert tl.restore_ms == 0.0 and tl.switch_restore_ms == 40.0 and tl.first_token_ms == 10.0
    bar = timeline_bar(tl, 20).plain
    assert PART_GLYPHS["restore"] not in bar and len(bar) == 20
    lines = timeline_legend(tl).plain.splitlines()
    assert not any(line.lstrip(PART_GLYPHS["restore"]).strip().startswith("restore") for line in lines)
    assert lines[-1] == "before the turn: state restored, 40 ms"


@pytest.mark.parametrize(("stop", "why"), [("cancelled", "stopped"), ("error", "failed")])
async def test_the_turn_detail_names_the_prompt_a_turn_never_reached(build, stop, why):
    from chatterm.core.metrics.turn_metrics import TurnMetrics

    m = TurnMetrics(engine="local", model_id="m", persona_id="p", submitted_at=1.0, prompt_tokens=3825,
                    cached_tokens=203, ahead_tokens=32, prefilled_tokens=512, stop_reason=stop)
    app, _ = build()
    async with app.run_test(size=(100, 30)) as pilot:
        await app.push_screen(TurnDetailScreen(1, m))
        await pilot.pause()
        details = str(app.screen.query_one("#turn-details", Static).render())
        assert f"3,110 not reached: {why}" in details
