"""A reply's next prompt carries the tokens sampled for it, on the real default
model: its text tokenized again splits differently ("Colosseum" sampled as
" Col" "osse" "a", tokenized as " Col" "os" "sea"), and the prompt would part
from the KV state kept after the reply there, prefilling most of it again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.interface import ChatMessage, ReplyTokens
from chatterm.core.store.resume import plan_resume, resume_conversation
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from tests.conftest import greedy
from tests.core.engine.test_local_engine import make_engine

ESSAY = "Write a long essay about the history of Rome, with many details."


@pytest.fixture
def ws(tmp_path):
    return Workspace.load()


@pytest.fixture
def persona(ws):
    return greedy(ws.personas.get("terse-coder"), max_tokens=120)


def retokenizes_differently(engine, turn) -> bool:
    """The precondition: this reply's text does not tokenize back to its sampled tokens."""
    text = engine.llm.tokenize(turn.reply.encode("utf-8"), add_bos=False, special=False)
    return text != list(turn.reply_tokens.ids)


def test_the_turn_after_a_long_reply_reuses_all_of_it(ws, persona):
    engine = make_engine(ws)
    try:
        conversation = Conversation(engine, persona)
        first = conversation.send(ESSAY)
        list(first.stream())
        kept = engine.context_used()  # the prompt and every sampled token the model has seen
        assert retokenizes_differently(engine, first)
        second = conversation.send("And Greece?")
        list(second.stream())
    finally:
        engine.close()
    m1, m2 = first.metrics, second.metrics
    assert m1.generated_tokens > 100
    assert kept >= m1.prompt_tokens + m1.generated_tokens - 1
    assert m2.cache_outcome == "memory"
    assert m2.cached_tokens == kept, m2.cache_detail
    assert m2.prefilled_tokens < 20  # the new message and the template around it


def test_a_resumed_session_restores_all_of_its_last_long_reply(ws, persona, tmp_path):
    db = tmp_path / "chat.db"
    engine = make_engine(ws)
    try:
        with SessionStore(db) as store:
            first = Conversation(engine, persona, store).send(ESSAY)
            list(first.stream())
            kept = engine.context_used()
            assert retokenizes_differently(engine, first)
            engine.wait_for_saves()
    finally:
        engine.close()
    engine = make_engine(ws)  # a new process: the state comes from disk, the history from SQLite
    try:
        with SessionStore(db) as store:
            (record,) = store.turns(store.latest_session_id())
            assert record.reply_tokens == first.reply_tokens
            conversation = resume_conversation(plan_resume(store, ws, "latest"), store, engine)
            conversation.persona = persona
            second = conversation.send("And Greece?")
            list(second.stream())
    finally:
        engine.close()
    m2 = second.metrics
    assert m2.cache_outcome == "restored"
    assert m2.cached_tokens == kept, m2.cache_detail


def test_tokens_that_do_not_spell_the_reply_are_not_used(ws, persona):
    engine = make_engine(ws)
    try:
        first = engine.start_turn(persona, [], ESSAY)
        list(first.stream())
        sampled, fits = first.reply_tokens, engine.fit_prompt
        history = [ChatMessage("user", ESSAY), ChatMessage("assistant", first.reply, sampled)]
        as_sampled = fits(persona, history, "And Greece?", 64).tokens
        as_text = fits(persona, [history[0], ChatMessage("assistant", first.reply)], "And Greece?", 64).tokens
        assert as_sampled != as_text
        # The reply edited (its tokens now spell another text), or sampled by another model.
        edited = [history[0], ChatMessage("assistant", first.reply + " Edited.", sampled)]
        assert fits(persona, edited, "And Greece?", 64).tokens == fits(
            persona, [history[0], ChatMessage("assistant", first.reply + " Edited.")], "And Greece?", 64).tokens
        other = [history[0], ChatMessage("assistant", first.reply, replace(sampled, model_identity="other"))]
        assert fits(persona, other, "And Greece?", 64).tokens == as_text

        def spells_its_text(text: str, ids: list[int]) -> bool:
            tokens = ReplyTokens.of(engine.model_identity, ids)
            with_tokens = [history[0], ChatMessage("assistant", text, tokens)]
            return fits(persona, with_tokens, "Hm?", 64).tokens != fits(
                persona, [history[0], ChatMessage("assistant", text)], "Hm?", 64).tokens

        def tokenize(text: str) -> list[int]:
            return engine.llm.tokenize(text.encode(), add_bos=False, special=False)

        # Letter by letter: another split of the same text, used.
        assert spells_its_text("A llama", [t for c in "A llama" for t in tokenize(c)])
        # Stopped inside a character: the text ends in U+FFFD, the tokens in its first byte.
        llama = tokenize("A 🦙")
        assert len(llama) > 2 and not spells_its_text("A \ufffd", llama[:-1])
        # A control token sampled mid-reply, which the text shows as nothing.
        (im_start,) = engine.llm.tokenize(b"<|im_start|>", add_bos=False, special=True)
        assert not spells_its_text("Sure.user\nthanks", [*tokenize("Sure."), im_start, *tokenize("user\nthanks")])
    finally:
        engine.close()
