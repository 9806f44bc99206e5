"""Where the model's memory begins: a conversation cut to fit the context marks
its oldest kept turn in the transcript, and the marker moves with the cut."""

from __future__ import annotations

from pilot_steps import loaded, send

from chatterm.ui.transcript import MEMORY_MARK, Notice, UserMessage


def marker_position(app):
    """(index of the marker among the view's children, the user message after it)."""
    view = app.query_one("#conversation")
    children = list(view.children)
    marks = [i for i, w in enumerate(children) if isinstance(w, Notice) and w.has_class(MEMORY_MARK)]
    if not marks:
        return None
    after = next(w for w in children[marks[0]:] if isinstance(w, UserMessage))
    return len(marks), after.text


async def test_the_marker_sits_before_the_oldest_kept_turn_and_moves_with_the_cut(build):
    app, engines = build()
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot)
        for text in ("one", "two", "three"):
            await send(pilot, text)
        assert marker_position(app) is None  # nothing left out yet
        engines[0].dropped_turns = 1  # the prompt of turn four leaves "one" out
        await send(pilot, "four")
        assert marker_position(app) == (1, "two")
        engines[0].dropped_turns = 3  # the cut moved: "two" and "three" out as well
        await send(pilot, "five")
        assert marker_position(app) == (1, "four")  # one marker, moved
        assert [w.text for w in app.query(UserMessage)] == ["one", "two", "three", "four", "five"]
