"""Regenerate and edit in the real app on the real default model (Pilot, real store):
a regenerated reply prefills at most 2 tokens, the old reply is kept and the new
one is current; an edit at turn 2 of 4 reuses exactly the prefix up to turn 2's
message, and the history sent to the model is the new path; switching back to a
persona resumes its conversation from the cache (no history prefill); a resumed
launch whose conversation no state holds prefills its history before Enter."""

from __future__ import annotations

import pytest
from pilot_steps import loaded, send, wait_for

from chatterm.core.cache.tokens import common_prefix_len
from chatterm.core.config import paths
from chatterm.core.engine.interface import ChatMessage
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from chatterm.ui.chat_view import TurnPhase
from chatterm.ui.launch import make_app

SIZE = (120, 40)


@pytest.fixture
def greedy_workspace(isolated_dirs, tmp_path) -> Workspace:
    folder = paths.user_personas_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "greedy.toml").write_text(
        'name = "Greedy"\nsystem_prompt = "You are a concise assistant."\n'
        "[sampling]\ntemperature = 0.0\nmax_tokens = 16\n"
    )
    return Workspace.load(db_path=tmp_path / "data" / "chatterm.db")


async def prepared(pilot) -> None:
    await loaded(pilot)
    await wait_for(pilot, lambda: pilot.app.session.persona_state.startswith(("restored", "prefilled", "already")),
                   timeout=120, what="the persona prefix")


async def turns(pilot, n: int) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: len(app.conversation.turns) == n and app.chat.phase is TurnPhase.IDLE,
                   timeout=120, what=f"turn {n}")


def spy_on_turns(engine) -> list[tuple[list[ChatMessage], str]]:
    """Record the history and message of every turn the engine is given."""
    seen: list[tuple[list[ChatMessage], str]] = []
    start_turn = engine.start_turn

    def spy(persona, history, user_text, **kwargs):
        seen.append((list(history), user_text))
        return start_turn(persona, history, user_text, **kwargs)

    engine.start_turn = spy
    return seen


async def test_regenerate_prefills_at_most_two_tokens_and_keeps_the_old_reply(greedy_workspace):
    with SessionStore(greedy_workspace.db_path) as store:
        app = make_app(greedy_workspace, persona_id="greedy", store=store, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            await send(pilot, "Name a large river.")
            await send(pilot, "Which country is it in?")
            sid = app.conversation.session_id
            old = store.turns(sid)[-1]
            await pilot.press("ctrl+r")
            await turns(pilot, 3)
            # Greedy sampling gives the same reply again: the user is told why.
            assert any("temperature 0 is greedy" in n.message for n in app._notifications)
            m = app.conversation.turns[-1]
            assert m.prefilled_tokens <= 2, m
            assert m.cached_tokens == m.prompt_tokens - m.prefilled_tokens
            path = store.turns(sid)
            assert [r.user_text for r in path] == ["Name a large river.", "Which country is it in?"]
            new = path[-1]
            assert new.index != old.index and new.sibling_label == "2/2"
            assert store.siblings(sid, new.index) == [old.index, new.index]
            assert store.turn(sid, old.index).reply == old.reply  # kept
            assert app.conversation.history[-1].content == new.reply


async def test_edit_at_turn_two_of_four_reuses_exactly_the_prefix_before_it(greedy_workspace):
    with SessionStore(greedy_workspace.db_path) as store:
        app = make_app(greedy_workspace, persona_id="greedy", store=store, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            questions = ["Name a fruit.", "Name a colour.", "Name a planet.", "Name a metal."]
            for question in questions:
                await send(pilot, question)
            engine = app.lease.engine
            persona = app.persona
            first = app.conversation.history[:2]
            seen = spy_on_turns(engine)
            edited = "Name a vegetable."
            # The prompts turn 2 had and its edit has: the context after turn 4 starts
            # with the former, so what can be reused is exactly their common prefix.
            before = engine._prompt_tokens(persona, first, questions[1])
            after = engine._prompt_tokens(persona, first, edited)
            shared = common_prefix_len(before, after)
            assert shared > len(engine._prompt_tokens(persona, [], questions[0]))  # turn 1 is in it

            app.query_one("#conversation").focus()
            await pilot.press("shift+up", "shift+up", "shift+up", "e")  # turn 4, 3, then 2 of 4
            prompt = app.query_one("#prompt")
            assert prompt.text == questions[1]
            prompt.clear()
            prompt.insert(edited)
            await pilot.press("enter")
            await turns(pilot, 5)
            m = app.conversation.turns[-1]
            assert m.prompt_tokens == len(after)
            assert m.cached_tokens == shared and m.prefilled_tokens == len(after) - shared
            assert seen == [(first, edited)]  # the history sent is the new path
            path = store.turns(app.conversation.session_id)
            assert [r.user_text for r in path] == [questions[0], edited]
            assert [m.content for m in app.conversation.history] == [
                questions[0], first[1].content, edited, path[-1].reply]


async def test_after_a_branch_switch_the_history_is_prefilled_before_anything_is_typed(greedy_workspace):
    with SessionStore(greedy_workspace.db_path) as store:
        app = make_app(greedy_workspace, persona_id="greedy", store=store, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            chat = app.chat
            idle = lambda: not chat._ahead_running  # noqa: E731
            await send(pilot, "Name a river in Europe.")
            await send(pilot, "Name a mountain in Asia.")
            # Edit the second message: the context then holds the edited branch.
            app.query_one("#conversation").focus()
            await pilot.press("shift+up", "e")  # the last turn, marked
            prompt = app.query_one("#prompt")
            assert prompt.text == "Name a mountain in Asia."
            prompt.clear()
            prompt.insert("Name a lake in Africa and say how deep it is.")
            await pilot.press("enter")
            await turns(pilot, 3)
            # ← back to the first version: its history goes in while nothing is typed.
            app.query_one("#conversation").focus()
            await pilot.press("left")
            await wait_for(pilot, lambda: app.conversation.history[-2].content == "Name a mountain in Asia.",
                           what="the first branch")
            await wait_for(pilot, idle, timeout=60, what="the idle prefill")
            prompt.focus()
            prompt.insert("And a desert?")
            await pilot.press("enter")  # before the type-ahead delay: the message itself is not ahead
            await turns(pilot, 4)
            m = app.conversation.turns[-1]
    # The first version's message and reply (after the edit point) were prefilled
    # before Enter, as history; the new message was prefilled by Enter, or typed
    # ahead where the type-ahead delay ran out before Enter arrived.
    assert m.ahead_history_tokens > 10, m
    assert m.prefilled_tokens + m.typed_ahead_tokens < 16, m


async def test_a_resumed_launch_prefills_the_history_no_state_holds_before_anything_is_typed(greedy_workspace):
    with SessionStore(greedy_workspace.db_path) as store:
        app = make_app(greedy_workspace, persona_id="greedy", store=store, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            await send(pilot, "Name a river in Europe.")
            await send(pilot, "Name a mountain in Asia.")
            sid = app.conversation.session_id
        # No stored state holds the conversation (another machine, a cleared cache).
        greedy_workspace.kv_cache().clear(kind="session")
        app = make_app(greedy_workspace, persona_id="greedy", store=store, resume=sid, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            await wait_for(pilot, lambda: app.conversation is not None and app.chat._ahead_running is False
                           and app.session.lease.engine.context_used() > 40, timeout=60, what="the idle prefill")
            prompt = app.query_one("#prompt")
            prompt.focus()
            prompt.insert("And a desert?")
            await pilot.press("enter")  # before the type-ahead delay: the message itself is not ahead
            await turns(pilot, 3)
            m = app.conversation.turns[-1]
    assert m.ahead_history_tokens > 20, m
    assert m.prefilled_tokens + m.typed_ahead_tokens < 16, m


async def test_switching_back_to_a_persona_resumes_its_conversation_from_the_cache(greedy_workspace):
    with SessionStore(greedy_workspace.db_path) as store:
        app = make_app(greedy_workspace, persona_id="greedy", store=store, gpu_status=lambda: None)
        async with app.run_test(size=SIZE) as pilot:
            await prepared(pilot)
            await send(pilot, "Name a large river and the sea it flows into.")
            first = app.conversation.session_id
            history_tokens = app.conversation.turns[-1].prompt_tokens + app.conversation.turns[-1].generated_tokens
            app.session.switch_persona("terse-coder")
            await wait_for(pilot, lambda: app.persona.id == "terse-coder" and app.conversation is not None,
                           timeout=60, what="the switch")
            await prepared(pilot)
            await send(pilot, "Say hi.")
            app.session.switch_persona("greedy")
            await wait_for(pilot, lambda: app.conversation is not None and app.conversation.session_id == first,
                           timeout=60, what="the first conversation")
            await prepared(pilot)
            await send(pilot, "How long is it?")
            m = app.conversation.turns[-1]
            # The history came back from the cache: only the new message was prefilled.
            assert m.cached_tokens >= history_tokens - 2, m
            assert m.prefilled_tokens < m.prompt_tokens - history_tokens + 4, m
