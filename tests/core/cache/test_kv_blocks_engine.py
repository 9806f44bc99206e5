"""KV blocks in the local engine, on the real default model: two conversations of
one persona store the persona's blocks once, and a conversation restored from
its blocks after a relaunch replies token for token like the uncached turn."""

from __future__ import annotations

import pytest

from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.store.resume import plan_resume, resume_conversation
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace

PERSONA = ("You are the support assistant of a small online shop. You answer in one short sentence. "
           "Refunds within 30 days need the order number. Lost parcels are re-sent once. ") * 6


@pytest.fixture
def ws(tmp_path):
    folder = tmp_path / "config" / "personas"
    folder.mkdir(parents=True)
    (folder / "shop.toml").write_text(
        f'name = "shop"\nsystem_prompt = """{PERSONA}"""\n[sampling]\ntemperature = 0.0\nmax_tokens = 10\n')
    return Workspace.load()


def make_engine(ws) -> LocalEngine:
    spec = ws.catalog.get(None)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=ws.kv_cache())
    engine.load()
    return engine


def say(conversation, text):
    turn = conversation.send(text)
    reply = "".join(turn.stream())
    assert turn.metrics.stop_reason != "error", turn.metrics.error
    return turn, reply


def test_two_sessions_of_a_persona_share_its_blocks_and_resume_from_them(ws):
    persona = ws.personas.get("shop")
    engine = make_engine(ws)
    try:
        with SessionStore(ws.db_path) as store:
            sessions = []
            for text in ("My parcel never arrived.", "Can I get a refund?"):
                conversation = Conversation(engine, persona, store=store)
                say(conversation, text)
                sessions.append(conversation)
            engine.wait_for_saves()
            cache = engine.kv_cache
            model = engine.spec.id
            chains = {(c.kind, c.key): c for c in cache.blocks.disk_chains(model)}
            prefix = chains[("persona", "shop")].tokens
            own = [len(chains[("session", str(c.session_id))].tokens) - len(prefix) for c in sessions]
            (usage,) = cache.usage()
            assert usage.bytes_per_token == 23_052  # SmolLM2, f16 KV: 2 x 30 x 3 x 64 x 2 + 12
            stored = usage.bytes
            # The persona once, each session's own tokens: not the persona three times.
            assert (len(prefix) + sum(own)) * usage.bytes_per_token <= stored
            assert stored <= 1.1 * (len(prefix) + sum(own)) * usage.bytes_per_token
            assert usage.shared_bytes >= len(prefix) * usage.bytes_per_token
            first = sessions[0]
            history = list(first.history)
    finally:
        engine.close()

    relaunched = make_engine(ws)  # a fresh process: nothing in RAM, the blocks on disk
    try:
        with SessionStore(ws.db_path) as store:
            resumed = resume_conversation(plan_resume(store, ws, first.session_id), store, relaunched)
            turn, reply = say(resumed, "How long does it take?")
        m = turn.metrics
        assert m.cache_outcome == "restored", m.cache_detail
        assert f"session {first.session_id}, restored from disk" in m.cache_detail
        assert m.prefilled_tokens == m.prompt_tokens - m.cached_tokens < 30
        relaunched.reset_context()
        cold = relaunched.start_turn(persona, history, "How long does it take?", use_cache=False)
        assert "".join(cold.stream()) == reply
    finally:
        relaunched.close()
