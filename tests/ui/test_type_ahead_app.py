"""Type-ahead in the real app on the real default model (Pilot): a message typed in
bursts, with a backspace into an earlier word, gives the plain send's prompt and
reply; Enter and Ctrl+Q during a long background prefill are not held up by it;
a draft deleted leaves neither its tokens in the context nor its count on the row."""

from __future__ import annotations

import pytest
from pilot_steps import loaded, wait_for

from chatterm.core.config import paths
from chatterm.core.metrics.turn_metrics import StopReason
from chatterm.core.workspace import Workspace
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.launch import make_app

MESSAGE = "Name three rivers in Europe and say which one is longest."
# Typed in bursts with pauses longer than the type-ahead delay; "rivres" is mistyped and
# taken back with backspaces into that earlier word.
BURSTS = ["Name three rivres", "\b\b\b\bvers in Eur", "ope and say which one is longest."]


@pytest.fixture
def greedy_workspace(isolated_dirs, tmp_path) -> Workspace:
    folder = paths.user_personas_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "greedy.toml").write_text(
        'name = "Greedy"\nsystem_prompt = "You are a concise assistant."\n'
        "[sampling]\ntemperature = 0.0\nmax_tokens = 16\n"
    )
    return Workspace.load(db_path=tmp_path / "data" / "chatterm.db")


async def type_text(pilot, text: str) -> None:
    for ch in text:
        await pilot.press({"\b": "backspace", " ": "space"}.get(ch, ch))


async def finished_turn(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: len(app.conversation.turns) == 1 and app.chat.phase is TurnPhase.IDLE,
                   timeout=120, what="the reply")
    return app.conversation.turns[0], app.conversation.history[1].content


async def prepared(pilot) -> None:
    """The model is loaded and the persona's prefix is in the context."""
    await loaded(pilot)
    await wait_for(pilot, lambda: pilot.app.session.persona_state.startswith(("restored", "prefilled", "already")),
                   timeout=120, what="the persona prefix")


async def test_typed_in_bursts_gives_the_plain_sends_prompt_and_reply(greedy_workspace):
    plain_app = make_app(greedy_workspace, persona_id="greedy", type_ahead=False, gpu_status=lambda: None)
    async with plain_app.run_test(size=(120, 40)) as pilot:
        await prepared(pilot)
        plain_app.query_one("#prompt").focus()
        await type_text(pilot, MESSAGE)
        await pilot.press("enter")
        plain, plain_reply = await finished_turn(pilot)
    assert plain.ahead_tokens == 0

    app = make_app(greedy_workspace, persona_id="greedy", gpu_status=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await prepared(pilot)
        app.query_one("#prompt").focus()
        for burst in BURSTS:
            await type_text(pilot, burst)
            await pilot.pause(app.chat.AHEAD_DELAY_S + 0.2)
        assert app.query_one("#prompt").text == MESSAGE
        await wait_for(pilot, lambda: not app.chat._ahead_running, timeout=60, what="the type-ahead prefill")
        await pilot.press("enter")
        ahead, ahead_reply = await finished_turn(pilot)
    assert ahead_reply == plain_reply
    assert ahead.prompt_tokens == plain.prompt_tokens
    assert ahead.ahead_tokens > 0 and ahead.ahead_ms > 0
    assert ahead.prefilled_tokens < plain.prefilled_tokens


PASTE = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens: 13 batches


async def paste_long(pilot, app):
    """PASTE in the focused prompt, prefilled at once (a paste): the prompt, once the prefill runs."""
    prompt = app.query_one("#prompt")
    prompt.focus()
    prompt.insert(PASTE)
    await wait_for(pilot, lambda: app.chat._ahead_running, timeout=30, what="the prefill to start")
    return prompt


async def test_enter_and_quit_during_a_long_background_prefill(greedy_workspace):
    app = make_app(greedy_workspace, persona_id="greedy", gpu_status=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await prepared(pilot)
        await paste_long(pilot, app)
        await pilot.press("enter")
        turn, _ = await finished_turn(pilot)
        assert turn.stop_reason in (StopReason.EOS, StopReason.LENGTH)
        # Another long paste, then quit while it is being prefilled.
        await paste_long(pilot, app)
        await pilot.press("ctrl+q")
    assert not app.is_running


async def test_a_deleted_draft_leaves_neither_the_context_nor_the_row(greedy_workspace):
    app = make_app(greedy_workspace, persona_id="greedy", gpu_status=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await prepared(pilot)
        engine = app.session.lease.engine
        prompt = app.query_one("#prompt")
        prompt.focus()
        await type_text(pilot, "Hi")
        await pilot.press("enter")
        await finished_turn(pilot)
        row = app.query_one("#dash-ahead")
        after_turn = engine.context_used()  # the first exchange
        prompt.insert(MESSAGE)  # a paste: prefilled at once
        await wait_for(pilot, lambda: engine.context_used() > after_turn + 5 and not app.chat._ahead_running,
                       timeout=60, what="the draft prefilled ahead")
        drafted = engine.context_used()
        assert row.display and "tokens ready" in str(row.render())
        for _ in MESSAGE:
            await pilot.press("backspace")
        # The context goes back to the history alone (the exchange and the
        # template's few tokens closing it), and the row no longer counts the draft.
        await wait_for(pilot, lambda: engine.context_used() <= after_turn + 3 and not app.chat._ahead_running,
                       timeout=60, what="the draft's tokens trimmed")
        assert engine.context_used() < drafted
        assert not row.display


async def test_a_draft_cleared_while_it_is_being_prefilled_leaves_no_row(greedy_workspace):
    app = make_app(greedy_workspace, persona_id="greedy", gpu_status=lambda: None)
    async with app.run_test(size=(120, 40)) as pilot:
        await prepared(pilot)
        prompt = await paste_long(pilot, app)
        prompt.clear()  # a bulk delete, the prefill still running
        await wait_for(pilot, lambda: not app.chat._ahead_running, timeout=60, what="the prefills to end")
        await pilot.pause(0.2)
        assert not app.query_one("#dash-ahead").display
