"""The figures a user watches most stay in view: after a turn, at 120x40 and at
80x24 (dashboard shown with F4), the headline (context, TTFT, decode) is inside
the screen whatever the panel's scroll, and the focused pane is marked."""

from __future__ import annotations

import pytest
from pilot_steps import loaded, send, wait_for
from textual.geometry import Region

from chatterm.ui.dashboard import HINT_ABOVE, HINT_FOCUSED, HINT_MORE, Dashboard


def drawn(widget) -> str:
    """The text a widget draws (styles dropped)."""
    width, height = widget.size
    return "\n".join(strip.text for strip in widget.render_lines(Region(0, 0, width, height)))


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_headline_stays_inside_the_screen_and_focus_is_marked(build, size):
    app, _ = build(["A reply long enough to show figures. " * 8] * 3)
    async with app.run_test(size=size) as pilot:
        await loaded(pilot)
        dash = app.query_one(Dashboard)
        if not dash.display:  # 80x24 hides the panel until F4
            await pilot.press("f4")
        for text in ("Hi", "And then?", "Thanks"):
            await send(pilot, text)
        await pilot.pause()
        screen = Region(0, 0, *size)
        now = dash.query_one("#dash-now")

        def headline_in_view() -> None:
            assert now.region.height >= 3 and screen.contains_region(now.region), (now.region, screen)
            assert dash.region.contains_region(now.region)
            lines = [line.strip() for line in drawn(now).splitlines()]
            labels = [line.split()[0] for line in lines if line]
            assert [label for label in labels if label in ("context", "TTFT", "decode")] == [
                "context", "TTFT", "decode"], lines

        headline_in_view()
        # Scrolled to the bottom (the model section), the headline is still there.
        dash.scroll_end(animate=False)
        await pilot.pause()
        assert dash.scroll_y > 0  # the panel does scroll at this size
        headline_in_view()
        # Focus moves with Tab; the focused dashboard says so on screen.
        hint = dash.query_one("#dash-hint")
        while not dash.has_focus:
            await pilot.press("tab")
        await pilot.pause()
        assert hint.has_class("-focused") and screen.contains_region(hint.region)
        assert drawn(hint).strip() in HINT_FOCUSED  # one of them whole, not cut
        # Typed there, words go to the prompt (they vanished before), the
        # focus with them.
        await pilot.press(*"hi there")
        prompt = app.query_one("#prompt")
        assert prompt.text == "hi there" and app.focused is prompt
        prompt.clear()
        dash.focus()
        await pilot.press("tab")
        await pilot.pause()
        assert not hint.has_class("-focused")
        # Scrolled to the end, the hint says the sections above are out of view;
        # a new conversation shows the panel from its top again.
        assert drawn(hint).strip() in HINT_ABOVE
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: dash.scroll_y == 0, what="the panel back at its top")
        await pilot.pause()
        assert drawn(hint).strip() in ("", *HINT_MORE)  # nothing above
