"""The prompt cache in the local engine, on the real default model: resumed
sessions, persona switches, edited and damaged conversation states, other
chat templates, progress on long prefills."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from chatterm.core.cache.prompt_cache import PromptCache
from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.store.resume import plan_resume, resume_conversation
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from tests.cli.test_cli_core import chatterm, write_greedy_persona
from tests.conftest import export_text

DATA = Path(__file__).parents[2] / "data"


@pytest.fixture
def ws(tmp_path):
    folder = tmp_path / "config" / "personas"
    folder.mkdir(parents=True)
    for name, prompt in (("quick", "You answer Python questions in one short, precise and friendly sentence, "
                                   "with a tiny example when it helps."),
                         ("other", "You are a pirate captain. Answer every question like one, in one line.")):
        (folder / f"{name}.toml").write_text(
            f'name = "{name}"\nsystem_prompt = """{prompt}"""\n[sampling]\ntemperature = 0.0\nmax_tokens = 12\n'
        )
    return Workspace.load()


@pytest.fixture
def store(ws):
    with SessionStore(ws.db_path) as s:
        yield s


def make_engine(ws, spec=None, cache=True) -> LocalEngine:
    spec = spec or ws.catalog.get(None)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=ws.kv_cache() if cache else None)
    engine.load()
    return engine


def say(conversation, text):
    turn = conversation.send(text)
    reply = "".join(turn.stream())
    assert turn.metrics.stop_reason != "error", turn.metrics.error
    return turn, reply


def uncached(engine, persona, history, text):
    """The same turn with nothing reused: empty context, no cache."""
    engine.reset_context()
    turn = engine.start_turn(persona, list(history), text, use_cache=False)
    reply = "".join(turn.stream())
    assert turn.metrics.cached_tokens == 0
    return turn, reply


def stored_conversation(ws, store, persona, *messages: str) -> Conversation:
    """A stored session of these messages, on an engine closed after them as at
    quit (every kept state reaches the disk)."""
    engine = make_engine(ws)
    try:
        conversation = Conversation(engine, persona, store=store)
        for message in messages:
            say(conversation, message)
    finally:
        engine.close()
    return conversation


def test_a_resumed_session_continues_token_for_token_and_prefills_only_the_new_message(ws, store):
    persona = ws.personas.get("quick")
    conversation = stored_conversation(ws, store, persona, "What is a list in Python?", "And a tuple?")
    history = list(conversation.history)

    relaunched = make_engine(ws)
    try:
        resumed = resume_conversation(plan_resume(store, ws, conversation.session_id), store, relaunched)
        turn, reply = say(resumed, "And a set?")
        m = turn.metrics
        new_words = len(relaunched.llm.tokenize(b"And a set?", add_bos=False, special=False))
        reference, reference_reply = uncached(relaunched, persona, history, "And a set?")
    finally:
        relaunched.close()
    assert m.cache_outcome == "restored", m.cache_detail
    assert f"reused {m.cached_tokens:,} of {m.prompt_tokens:,} tokens (conversation, " \
           f"session {conversation.session_id}, restored from disk)" in m.cache_detail
    assert m.restore_ms is not None and m.restore_ms > 0
    # Only the new message and the template's few tokens around it are prefilled.
    assert m.prefilled_tokens == m.prompt_tokens - m.cached_tokens
    assert new_words <= m.prefilled_tokens <= new_words + 12
    assert reference.metrics.prompt_tokens == m.prompt_tokens
    assert reply == reference_reply and m.generated_tokens == reference.metrics.generated_tokens


def test_a_session_carried_on_on_another_model_resumes_there_and_its_report_names_both(ws, store):
    persona = ws.personas.get("quick")
    sid = stored_conversation(ws, store, persona, "What is a list in Python?").session_id
    other = ws.catalog.get("smollm2-135m-q8kv")
    second = make_engine(ws, other)
    try:
        plan = plan_resume(store, ws, sid, model_id=other.id)
        assert plan.warnings  # another model than the recorded one: said
        say(resume_conversation(plan, store, second), "And a tuple?")
    finally:
        second.close()
    # The session is now on the model its last turn ran on: a plain resume comes back to it.
    assert store.session(sid).model_id == other.id
    again = plan_resume(store, ws, sid)
    assert again.spec.id == other.id and not again.warnings
    assert [r.metrics.model_id for r in store.turns(sid)] == ["smollm2-135m", other.id]
    report = export_text(store, [sid], "md")
    assert f"smollm2-135m, then {other.id}" in report


def test_persona_a_then_b_then_back_to_a_restores_a_conversation(ws, store):
    a, b = ws.personas.get("quick"), ws.personas.get("other")
    engine = make_engine(ws)
    try:
        with_a = Conversation(engine, a, store=store)
        say(with_a, "Name a colour.")
        say(with_a, "Another one?")
        engine.prepare_persona(b)
        with_b = Conversation(engine, b, store=store)
        say(with_b, "Where is the treasure?")
        engine.prepare_persona(a)  # the switch back restores A's persona prefix...
        turn, reply = say(with_a, "And a third?")  # ...and the turn A's whole conversation
        history = with_a.history[:-2]
        reference, reference_reply = uncached(engine, a, history, "And a third?")
    finally:
        engine.close()
    m = turn.metrics
    assert m.cache_outcome == "restored", m.cache_detail
    assert f"session {with_a.session_id}, restored from RAM" in m.cache_detail
    assert m.cached_tokens > len(engine.persona_prefix(a).tokens) + 20
    assert reply == reference_reply


def test_an_edited_history_falls_back_to_the_persona_prefix(ws, store):
    persona = ws.personas.get("quick")
    conversation = stored_conversation(ws, store, persona, "What is a list in Python?", "And a tuple?")
    with sqlite3.connect(ws.db_path) as db:  # edited after its state was saved
        db.execute("UPDATE turns SET user_text = 'Tell me about sets.' WHERE turn_index = 1")
    relaunched = make_engine(ws)
    try:
        resumed = resume_conversation(plan_resume(store, ws, conversation.session_id), store, relaunched)
        assert resumed.history[0].content == "Tell me about sets."
        history = list(resumed.history)
        turn, reply = say(resumed, "And a dict?")
        prefix = len(relaunched.persona_prefix(persona).tokens)
        _, reference_reply = uncached(relaunched, persona, history, "And a dict?")
    finally:
        relaunched.close()
    m = turn.metrics
    assert f"session {conversation.session_id} (disk): holds another version of the conversation" in m.cache_detail
    assert f"reused {prefix:,} of {m.prompt_tokens:,} tokens (persona prefix, restored from disk)" in m.cache_detail
    assert m.cached_tokens == prefix
    assert reply == reference_reply


# A conversation is stored as its persona's blocks, its own blocks and a chain
# record: the damage goes to the conversation's newest block, or to its record.
def _flip_payload_byte(record, block):
    data = bytearray(block.read_bytes())
    data[-100] ^= 0xFF
    block.write_bytes(bytes(data))


def _truncate(record, block):
    block.write_bytes(block.read_bytes()[:-5000])


def _foreign(record, block):
    body = json.loads(record.read_text())
    body["compat"]["model_sha256"] = "0" * 64
    record.write_text(json.dumps(body))


@pytest.mark.parametrize(
    "damage, reason",
    [(_flip_payload_byte, "payload checksum mismatch"), (_truncate, "truncated"),
     (_foreign, "other model or settings: model sha256 differs")],
)
def test_damaged_conversation_states_are_rejected_and_rebuilt(ws, store, damage, reason):
    persona = ws.personas.get("quick")
    engine = make_engine(ws)
    try:
        conversation = Conversation(engine, persona, store=store)
        say(conversation, "What is a list in Python?")
        engine.wait_for_saves()
        blocks = engine.kv_cache.blocks
        (chain,) = [c for c in blocks.disk_chains(engine.spec.id)
                    if c.kind == "session" and c.key == str(conversation.session_id)]
        damage(chain.path, blocks.block_path(engine.spec.id, chain.segments[-1][0]))
        engine.reset_context()  # as a relaunch: empty context,
        engine.kv_cache.clear_ram()  # nothing in RAM
        history = list(conversation.history)
        turn, reply = say(conversation, "And a tuple?")
        assert reason in turn.metrics.cache_detail
        assert "(persona prefix, restored" in turn.metrics.cache_detail  # the longest valid prefix
        _, reference_reply = uncached(engine, persona, history, "And a tuple?")
        assert reply == reference_reply  # the damaged state was never used

        engine.wait_for_saves()  # the turn's state replaced the damaged file
        engine.reset_context()
        engine.kv_cache.clear_ram()
        again, _ = say(conversation, "And a set?")
        assert "(conversation, session" in again.metrics.cache_detail
        assert "restored from disk" in again.metrics.cache_detail
    finally:
        engine.close()


def test_a_non_chatml_template_override_reuses_the_persona_prefix(ws):
    persona = ws.personas.get("quick")
    spec = replace(ws.catalog.get(None), id="smollm2-gemma3", chat_template=str(DATA / "gemma-3-it.jinja"))
    first = make_engine(ws, spec)
    try:
        assert first.template.source.startswith("file ")
        cold = first.start_turn(persona, [], "Name a colour.")
        cold_reply = "".join(cold.stream())
        prefix = first.persona_prefix(persona)
        prefix_text = first.llm.detokenize(prefix.tokens, special=True).decode()
    finally:
        first.close()
    assert prefix.helps and persona.system_prompt.strip() in prefix_text
    assert prefix_text.startswith("<|im_start|><start_of_turn>user\n")  # bos, then system folded into user
    assert "persona prefix saved for next time" in cold.metrics.cache_detail
    second = make_engine(ws, spec)
    try:
        warm = second.start_turn(persona, [], "Name a colour.")
        warm_reply = "".join(warm.stream())
    finally:
        second.close()
    m = warm.metrics
    assert m.cache_outcome == "restored"
    assert f"reused {len(prefix.tokens):,} of {m.prompt_tokens:,} tokens (persona prefix, restored from disk)" \
        in m.cache_detail
    assert m.cached_tokens == len(prefix.tokens)
    assert warm_reply == cold_reply


def test_a_template_with_a_late_system_prompt_says_the_persona_cache_cannot_help(ws):
    persona = ws.personas.get("quick")
    spec = replace(ws.catalog.get(None), id="smollm2-mistral3",
                   chat_template=str(DATA / "mistral-7b-instruct-v0.3.jinja"))
    engine = make_engine(ws, spec)
    try:
        turn = engine.start_turn(persona, [], "Name a colour.")
        for _ in turn.stream():
            pass
        engine.wait_for_saves()
        assert persona.id not in engine.cached_personas()  # nothing worth saving
    finally:
        engine.close()
    assert turn.metrics.stop_reason in ("eos", "length"), turn.metrics.error  # a reply, maybe empty:
    assert "persona cache cannot help with this template" in turn.metrics.cache_detail  # SmolLM2 never saw it


def test_a_long_prefill_reports_progress(ws):
    persona = ws.personas.get("quick")
    engine = make_engine(ws)
    try:
        turn = engine.start_turn(persona, [], "Summarise: " + "the cat sat on the mat. " * 120)
        seen: set[int] = set()
        done = threading.Event()

        def watch():
            while not done.is_set():
                if turn.prefill_progress is not None:
                    seen.add(turn.prefill_progress.done)
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            list(turn.stream())
        finally:
            done.set()
            watcher.join()
    finally:
        engine.close()
    m = turn.metrics
    progress = turn.prefill_progress
    assert progress.total == m.prefilled_tokens > 512  # more than one batch
    assert progress.done == progress.total
    assert progress.rate > 0 and progress.eta_s == 0
    assert any(0 < n < progress.total for n in seen)  # seen while it ran


def test_ask_session_resumes_the_conversation_state(tmp_path):
    write_greedy_persona(tmp_path)
    first = chatterm(tmp_path, "ask", "--persona", "quick", "--json", "What is a list?")
    assert first.returncode == 0, first.stderr
    session = json.loads(first.stdout)["session_id"]
    again = chatterm(tmp_path, "ask", "--session", str(session), "--json", "And a tuple?")
    assert again.returncode == 0, again.stderr
    metrics = json.loads(again.stdout)["metrics"]
    assert metrics["cache_outcome"] == "restored"
    assert f"(conversation, session {session}, restored from disk)" in metrics["cache_detail"]
    listing = chatterm(tmp_path, "cache", "ls").stdout
    assert f"session {session}" in listing
    assert PromptCache(tmp_path / "cache" / "kv").entries()  # files are in the usual folder


def test_a_turn_another_process_records_meanwhile_stays_out_of_this_history(ws, store, tmp_path):
    """`ask --session` adds a turn to a session this process carries on (the TUI
    open beside a script): this process's next turn was prompted without it, so
    it is stored beside it, a branch, and the path shown stays what the model saw."""
    persona = ws.personas.get("quick")
    sid = stored_conversation(ws, store, persona, "What is a list in Python?").session_id
    engine = make_engine(ws)
    try:
        resumed = resume_conversation(plan_resume(store, ws, sid), store, engine)
        other = chatterm(tmp_path, "ask", "--session", str(sid), "--json", "And a tuple?")
        assert other.returncode == 0, other.stderr
        say(resumed, "And a set?")
        say(resumed, "And a dict?")
    finally:
        engine.close()
    path = store.turns(sid)
    assert [r.user_text for r in path] == ["What is a list in Python?", "And a set?", "And a dict?"]
    elsewhere = store.turn(sid, 2)
    assert elsewhere.user_text == "And a tuple?" and elsewhere.parent == 1
    assert path[1].index == 3 and path[1].parent == 1 and path[1].sibling_label == "2/2"
    assert path[2].parent == 3 and resumed.leaf == path[2].index
    # Its session figures count the other process's turn too, as the listings do.
    assert len(resumed.turns) == store.session(sid).turns == 4
