"""A conversation longer than the context, on the real default model: under
`shift` every turn after an overflow prefills only its new tokens, under
`truncate` a full re-prefill happens once per cut, not on every turn, and a
relaunch resumes a shifted conversation without prefilling its history."""

from __future__ import annotations

from dataclasses import replace

import pytest

from chatterm.core.cache.prompt_cache import PromptCache
from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.interface import ChatMessage
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.metrics.format import context_cut_label
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from tests.conftest import greedy

N_CTX = 512
TURNS = 16
TEMPLATE_SLACK = 24
"""Tokens a turn may prefill beyond its own message: the template's role markers
and the end of the previous reply (its last token is sampled, not evaluated)."""


def message(i: int) -> str:
    return f"Note {i}: " + " ".join(f"item{i}-{k}" for k in range(4)) + ". Say ok."


@pytest.fixture
def ws(tmp_path):
    return Workspace.load(db_path=tmp_path / "chatterm.db")


def engine_for(ws, policy: str) -> LocalEngine:
    spec = replace(ws.catalog.get(None), id=f"small-{policy}", n_ctx=N_CTX, context_overflow=policy)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(ws.kv_dir))
    engine.load()
    return engine


def own_tokens(engine: LocalEngine, text: str) -> int:
    return len(engine.llm.tokenize(text.encode(), add_bos=False, special=False))


def converse(ws, policy: str, relaunch_each_turn: bool = False, type_ahead: bool = False,
             notices: list[list[str]] | None = None):
    """TURNS turns of one stored conversation; (metrics, own tokens, engine policy, session id).
    `type_ahead`: each message is prefilled ahead first, as the TUI does while
    it is typed; `notices` gets each turn's notices."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=24)
    rows, policy_used = [], None
    with SessionStore(ws.db_path) as store:
        session_id, history = None, []
        engine = engine_for(ws, policy)
        try:
            for i in range(TURNS):
                if relaunch_each_turn and i:
                    engine.wait_for_saves()
                    engine.close()
                    engine = engine_for(ws, policy)
                conversation = Conversation(engine, persona, store=store, session_id=session_id, history=history)
                if type_ahead:
                    engine.prefill_ahead(persona, history, message(i))
                turn = conversation.send(message(i))
                list(turn.stream())
                if notices is not None:
                    notices.append(list(turn.notices))
                m = turn.metrics
                assert m.stop_reason in ("eos", "length"), m.error
                rows.append((m, own_tokens(engine, message(i))))
                session_id, history = conversation.session_id, conversation.history
            policy_used = (engine.overflow.value, engine.overflow_reason, engine.device().overflow)
            engine.wait_for_saves()
        finally:
            engine.close()
    return rows, policy_used, session_id


def test_shift_prefills_only_new_tokens_after_every_overflow(ws):
    rows, (policy, reason, line), _ = converse(ws, "auto")
    assert policy == "shift" and reason == "the model's memory can shift" and line.startswith("shift (")
    cuts = [i for i, (m, _) in enumerate(rows) if m.cut_turns]
    assert len(cuts) >= 2, [m.prompt_tokens for m, _ in rows]  # it overflowed more than once
    for i, (m, own) in enumerate(rows[1:], 1):
        assert m.prefilled_tokens <= own + TEMPLATE_SLACK, (i, m.prefilled_tokens, own, m.cache_detail)
        assert m.prompt_tokens + 24 <= N_CTX
    for i in cuts:
        m = rows[i][0]
        assert m.shifted_tokens > 0 and m.shift_ms >= 0, m.cache_detail
        assert "shifted out" in m.cache_detail
    # Between cuts the cut holds: the turns left out stay the same number.
    dropped = [m.dropped_turns for m, _ in rows]
    assert all(b >= a for a, b in zip(dropped, dropped[1:], strict=False))


def test_a_shift_made_while_the_message_was_typed_is_the_turns(ws):
    """Type-ahead shifted the context before Enter: the turn's notice said "the
    rest is prefilled once" and its shifted_tokens read 0, though nothing was
    prefilled again."""
    notices: list[list[str]] = []
    rows, (policy, _, _), _ = converse(ws, "auto", type_ahead=True, notices=notices)
    assert policy == "shift"
    cuts = [i for i, (m, _) in enumerate(rows) if m.cut_turns]
    assert len(cuts) >= 2
    for i in cuts:
        m = rows[i][0]
        assert m.shifted_tokens > 0 and m.ahead_tokens > 0, (i, m.cache_detail)
        assert "shifted out" in m.cache_detail
        cut_notice = next(n for n in notices[i] if n.startswith("Context full"))
        assert "shifted out of the cached state" in cut_notice and "prefilled once" not in cut_notice
    for i, (m, own) in enumerate(rows[1:], 1):
        assert m.prefilled_tokens <= own + TEMPLATE_SLACK, (i, m.prefilled_tokens, m.cache_detail)


def test_a_shift_typed_ahead_in_one_conversation_is_not_the_next_ones(ws):
    """Shifted while a message was typed, then left for a new conversation
    (Ctrl+N, same persona): its first turn reported the shift as its own."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=24)
    engine = engine_for(ws, "auto")
    try:
        history = []
        for i in range(TURNS):
            conversation = Conversation(engine, persona, history=history)
            engine.prefill_ahead(persona, history, message(i))
            if engine._ahead.shifted:
                break  # shifted while typing: the user now leaves this conversation
            list(conversation.send(message(i)).stream())
            history = conversation.history
        else:
            pytest.fail("no turn overflowed")
        fresh = Conversation(engine, persona, history=[])
        engine.prefill_ahead(persona, [], "hello there")
        turn = fresh.send("hello there")
        list(turn.stream())
        assert turn.metrics.shifted_tokens == 0 and "shifted out" not in turn.metrics.cache_detail
    finally:
        engine.close()


@pytest.mark.parametrize("type_ahead", [False, True])
def test_a_new_conversation_never_starts_from_another_ones_turns_shifted(ws, type_ahead):
    """Ctrl+N, then a message an earlier turn also sent: the old turns before it
    were shifted out and its KV, computed with them in view, reused ("2 in (56
    cached)"), so a greedy reply differed from a fresh prefill's. Only a prompt
    that leaves turns out may shift."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=24)
    repeated = "The quick brown fox jumps over the lazy dog and keeps running far away."
    engine = engine_for(ws, "auto")
    try:
        old = Conversation(engine, persona, history=[])
        for text in ("alpha beta gamma", repeated):
            list(old.send(text).stream())
        fresh = Conversation(engine, persona, history=[])
        if type_ahead:
            engine.prefill_ahead(persona, [], repeated)
        turn = fresh.send(repeated)
        reply = "".join(turn.stream())
        m = turn.metrics
        assert m.shifted_tokens == 0 and "shifted out" not in m.cache_detail, m.cache_detail
        assert m.reused_tokens <= len(engine.prefix_tokens(persona)), m.cache_detail
    finally:
        engine.close()
    cold = engine_for(ws, "auto")
    try:
        cold.kv_cache = None
        assert "".join(Conversation(cold, persona, history=[]).send(repeated).stream()) == reply
    finally:
        cold.close()


def test_a_session_opened_with_turns_left_out_never_shifts_another_ones_context(ws):
    """The context holds session 70; session 71 is opened (F3) and its prompt
    leaves its first turn out, keeping a message and reply the same as 70's
    second: 70's first turn was shifted out and its KV reused for them."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=24)
    repeated = "The quick brown fox jumps over the lazy dog and keeps running far away."
    engine = engine_for(ws, "auto")
    try:
        old = Conversation(engine, persona, history=[])
        engine.note_conversation(70)
        for text in ("alpha beta gamma", repeated):
            list(old.send(text).stream())
        engine.note_conversation(71)
        history = [ChatMessage("user", "word " * 420), ChatMessage("assistant", "ok"), *old.history[2:]]
        turn = engine.start_turn(persona, history, "And?")
        list(turn.stream())
        m = turn.metrics
        assert m.dropped_turns == 1, turn.notices
        assert m.shifted_tokens == 0 and "shifted out" not in m.cache_detail, m.cache_detail
        assert m.reused_tokens <= len(engine.prefix_tokens(persona)), m.cache_detail
    finally:
        engine.close()


def test_truncate_reprefills_once_per_cut_not_every_turn(ws):
    rows, (policy, reason, _), _ = converse(ws, "truncate")
    assert policy == "truncate" and reason == "set in models.toml"
    full = [i for i, (m, own) in enumerate(rows[1:], 1) if m.prefilled_tokens > own + TEMPLATE_SLACK]
    cuts = [i for i, (m, _) in enumerate(rows) if m.cut_turns]
    assert cuts and full == cuts  # a re-prefill exactly where the cut moved
    assert len(cuts) <= TURNS // 3  # once every several turns
    assert all(m.shifted_tokens == 0 for m, _ in rows)


def test_a_relaunch_after_every_turn_resumes_the_shifted_conversation(ws):
    """Each turn in a fresh process (as `chatterm ask --session` runs): the state
    is restored from disk, shifted there when the cut moves, and the history is
    never prefilled again; the store keeps every turn."""
    rows, _, session_id = converse(ws, "shift", relaunch_each_turn=True)
    assert any(m.cut_turns for m, _ in rows)
    for i, (m, own) in enumerate(rows[1:], 1):
        assert m.cache_outcome == "restored", (i, m.cache_detail)
        assert m.prefilled_tokens <= own + TEMPLATE_SLACK, (i, m.prefilled_tokens, own, m.cache_detail)
    with SessionStore(ws.db_path, readonly=True) as store:
        assert [r.user_text for r in store.turns(session_id)] == [message(i) for i in range(TURNS)]


def test_the_newest_turn_stays_while_it_fits_and_a_cut_of_every_turn_says_so(ws):
    """A 412-token turn in a 1,024 context was left out with every turn before it
    (the cut aims at half the budget), and the notice said "the rest is
    prefilled once" of a prompt with no history left."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=24)
    engine = engine_for(ws, "shift")
    try:
        # "word " is one token; the budget is 488 (512 less 24 for the reply), half of it 244.
        history = [ChatMessage("user", "word " * 200), ChatMessage("assistant", "ok"),
                   ChatMessage("user", "word " * 250), ChatMessage("assistant", "ok")]
        fitted = engine.fit_prompt(persona, history, "And?", 24)
        assert fitted.dropped_turns == 1  # over half the budget, but it fits: kept
        # From an empty context (a model switched to, say) nothing could be
        # shifted: it said "prefilled once (shift: the model's memory can shift)".
        first = engine.start_turn(persona, history, "And?")
        list(first.stream())
        assert first.metrics.dropped_turns == 1 and first.metrics.shifted_tokens == 0
        assert ("Context full (512 tokens, 24 of them kept for the reply): the oldest turn left the model's "
                "context, the rest is prefilled once (too little of it was in the model's memory to shift).") \
            in first.notices
        engine.reset_context()
        turn = engine.start_turn(persona, history, "word " * 250)  # now the newest turn does not fit
        list(turn.stream())
        assert turn.metrics.dropped_turns == 2, turn.notices
        (notice,) = [n for n in turn.notices if n.startswith("Context full")]
        assert notice == ("Context full (512 tokens, 24 of them kept for the reply): the oldest 2 turns left "
                          "the model's context; no earlier turn is left in it, only the persona and this message.")
        # The footer agrees: it said "cut, the rest prefilled" of a prompt with no rest.
        assert context_cut_label(turn.metrics) == "context full: 2 oldest turns cut (not shifted)"
    finally:
        engine.close()
