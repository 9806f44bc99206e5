"""Pilot tests of `ChatView` (the turn loop and its phases), of replies drawn
as one widget (Markdown while streaming, theme colours), and of paging a
resumed session in as the user scrolls up.

The engine is the scripted one (tests/ui/fake_engine.py); the session store
is a real SQLite file in tmp_path.
"""

from __future__ import annotations

import threading

from fake_engine import tokens_of
from pilot_steps import loaded, send, wait_for
from test_app import reply_text
from textual.geometry import Region

from chatterm.core.metrics.turn_metrics import TurnMetrics
from chatterm.core.store.session_store import SessionStore
from chatterm.errors import ChattermError
from chatterm.ui.chat_view import FrameBudget, TurnPhase
from chatterm.ui.resume import TAIL_TURNS
from chatterm.ui.transcript import AssistantReply, ConversationView, UserMessage

SIZE = (120, 40)

LONG_MARKDOWN = (
    "## Plan\n\nFirst a paragraph with **bold** text.\n\n- alpha\n- beta\n\n"
    "```python\nprint('[bold]literal[/]')\n```\n\nA closing paragraph that is still being written"
)


async def test_enter_walks_the_turn_through_its_phases(build):
    gate = threading.Event()
    app, engines = build(["one two three four five six"], load_gate=gate)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines and engines[0].loading.is_set(), what="the load to start")
        assert app.chat.phase is TurnPhase.NO_MODEL
        gate.set()
        await loaded(pilot)
        assert app.chat.phase is TurnPhase.IDLE
        engines[0].hold_after = 2
        app.query_one("#prompt").insert("count")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        assert app.chat.phase is TurnPhase.STREAMING
        # A second Enter while a reply streams is refused; the text stays in the prompt.
        app.query_one("#prompt").insert("next question")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("Esc stops it" in n.message for n in app._notifications),
                       what="the refusal")
        assert app.query_one("#prompt").text == "next question"
        assert len(app.query(UserMessage)) == 1
        await pilot.press("escape")
        assert app.chat.phase is TurnPhase.STOPPING
        engines[0].gate.set()
        await wait_for(pilot, lambda: app.chat.phase is TurnPhase.IDLE, what="the end of the turn")
        assert app.conversation.turns[0].stop_reason == "cancelled"
        # Back to IDLE: Enter sends again.
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.conversation.turns) == 2 and app.chat.phase is TurnPhase.IDLE,
                       what="the second turn")
        assert engines[0].received[1][2] == "next question"


async def test_enter_while_the_model_loads_sends_once_it_has_loaded(build):
    gate = threading.Event()
    app, engines = build(["bonjour"], load_gate=gate)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines and engines[0].loading.is_set(), what="the load to start")
        app.query_one("#prompt").insert("Hi there")
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("as soon as it is ready" in n.message for n in app._notifications),
                       what="the notice")
        assert app.query_one("#prompt").text == "Hi there" and not app.query(UserMessage)
        app.query_one("#prompt").insert(", in French")  # still editable meanwhile
        gate.set()
        await loaded(pilot)
        await wait_for(pilot, lambda: len(app.conversation.turns) == 1 and app.chat.phase is TurnPhase.IDLE,
                       what="the queued turn")
        assert engines[0].received[0][2] == "Hi there, in French"
        assert app.query_one("#prompt").text == ""


async def test_markdown_renders_while_streaming_and_stays_the_same_once_finished(build):
    app, engines = build([LONG_MARKDOWN])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        engines[0].hold_after = next(i for i, t in enumerate(tokens_of(LONG_MARKDOWN)) if "being" in t)
        app.query_one("#prompt").insert("plan?")
        await pilot.press("enter")
        await wait_for(pilot, engines[0].held.is_set, what="the stream to be held")
        await wait_for(pilot, lambda: "still" in reply_text(app.query_one(AssistantReply)),
                       what="the streamed text")
        streaming = reply_text(app.query_one(AssistantReply))
        # Finished blocks are rendered Markdown: no "##", bullets, bold without stars.
        assert "Plan" in streaming and "## Plan" not in streaming
        assert "• alpha" in streaming and "**bold**" not in streaming
        assert "print('[bold]literal[/]')" in streaming  # code stays literal
        engines[0].gate.set()
        await wait_for(pilot, lambda: app.chat.phase is TurnPhase.IDLE and app.conversation.turns,
                       what="the end of the turn")
        reply = app.query_one(AssistantReply)
        finished = reply_text(reply)
        assert "being written" in finished
        # Everything shown while streaming is still there, in the same words.
        assert " ".join(streaming.split()) in " ".join(finished.split())
        assert not reply.children  # one widget: it draws its own lines


def _long_session(store: SessionStore, turns: int) -> int:
    sid = store.create_session(model_id="smollm2-135m", model_identity="abc", engine="local",
                               device="CPU", persona_id="assistant")
    for i in range(1, turns + 1):
        m = TurnMetrics(engine="local", model_id="smollm2-135m", persona_id="assistant",
                        submitted_at=1.7e9 + i, ttft_ms=100.0, generated_tokens=3,
                        decode_ms=40.0, stop_reason="eos")
        store.record_turn(sid, f"Question {i}", f"Answer {i}\n\n" + "word " * 120, m)
    return sid


def _question_numbers(app) -> list[int]:
    return [int(str(u.render()).split()[1]) for u in app.query(UserMessage)]


async def test_resume_mounts_the_tail_and_scrolling_up_pages_in_the_rest_in_order(build, workspace):
    store = SessionStore(workspace.db_path)
    sid = _long_session(store, 40)
    app, engines = build(resume=sid, store=store)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        view = app.query_one(ConversationView)
        assert _question_numbers(app) == list(range(41 - TAIL_TURNS, 41))
        assert view.has_older
        # The model still gets the whole history (the UI only mounts less).
        assert len(app.conversation.history) == 80
        pages = 0
        while view.has_older:
            view.scroll_home(animate=False)
            before = len(app.query(UserMessage))
            await wait_for(pilot, lambda before=before: len(app.query(UserMessage)) > before or not view.has_older,
                           what="an older page")
            pages += 1
            # The user's place is kept: after a page comes in, the view is no
            # longer at the top (it would otherwise page everything in at once).
            if view.has_older:
                await wait_for(pilot, lambda: view.scroll_y > view.LOAD_MARGIN, what="the kept place")
        assert _question_numbers(app) == list(range(1, 41))
        assert pages >= (40 - TAIL_TURNS) // view.PAGE_TURNS
        await send(pilot, "And now?")
        assert len(engines[0].received[-1][1]) == 80
    store.close()


def test_turns_page_reads_a_session_backwards_a_page_at_a_time(workspace):
    store = SessionStore(workspace.db_path)
    sid = _long_session(store, 12)
    newest = store.turns_page(sid, None, 5)
    assert [r.index for r in newest] == [8, 9, 10, 11, 12]
    assert newest[-1].user_text == "Question 12" and newest[-1].metrics.ttft_ms == 100.0
    assert [r.index for r in store.turns_page(sid, 8, 5)] == [3, 4, 5, 6, 7]
    assert [r.index for r in store.turns_page(sid, 3, 5)] == [1, 2]
    assert store.turns_page(sid, 1, 5) == []
    try:
        store.turns_page(999, None, 5)
    except ChattermError as exc:
        assert "999" in str(exc)
    else:
        raise AssertionError("an unknown session must be refused")
    store.close()


def test_frame_budget_writes_less_often_when_frames_cost_more():
    budget = FrameBudget(max_hz=30.0, min_hz=4.0, share=0.5)
    assert budget.interval == budget.min_interval
    budget.spent(0.005)  # cheap frames: as often as allowed
    assert budget.interval == budget.min_interval
    budget.spent(0.100)  # a 100 ms frame: wait 200 ms so frames take half the loop
    assert abs(budget.interval - 0.200) < 1e-9
    budget.spent(1.0)  # never slower than min_hz
    assert budget.interval == budget.max_interval
    for _ in range(50):  # cheap again: back to the fastest rate, gradually
        budget.spent(0.001)
    assert budget.interval == budget.min_interval


async def test_a_replys_name_and_footer_follow_the_theme(build):
    app, engines = build(["Themed."])
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot)
        await send(pilot, "hi")
        reply = app.query_one(AssistantReply)

        def name_colour() -> str:
            region = Region(0, 0, reply.size.width, 1)
            segment = next(s for s in reply.render_lines(region)[0] if s.text.strip())
            return segment.style.color.triplet.hex

        assert name_colour() == "#4ea1ff"  # chatterm-dark's primary
        app.theme = "chatterm-light"
        await wait_for(pilot, lambda: name_colour() == "#0b5cad", what="the light theme's primary")
        assert "Themed." in reply.body_text and "TTFT" in reply.footer_text
