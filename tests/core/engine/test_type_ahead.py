"""Type-ahead prefill on the real default model: same prompt and reply as a plain
send, edits trimmed back instead of recomputed, a starting turn preempts it."""

from __future__ import annotations

import threading

import pytest

from chatterm.core.cache.prompt_cache import Slot
from chatterm.core.engine.interface import ChatMessage
from chatterm.core.metrics.turn_metrics import StopReason
from chatterm.core.workspace import Workspace
from tests.conftest import greedy

MESSAGE = (
    "Please summarise the following notes about the quarterly sales meeting and "
    "list the three biggest risks mentioned by the team."
)
FIRST = "Hi, I am Ada."
# Typed in bursts, with a typo taken back by backspacing into an earlier word.
BURSTS = [
    "Please summ",
    "Please summarise the fol",
    "Please summarise the following notes abuot",
    "Please summarise the following notes ab",
    MESSAGE[:-20],
    MESSAGE,
]


@pytest.fixture(scope="module")
def engine():
    ws = Workspace.load()
    spec = ws.catalog.get(None)
    engine = ws.make_engine(spec)
    engine.load()
    yield engine
    engine.close()


@pytest.fixture
def persona():
    return greedy(Workspace.load().personas.get("assistant"), max_tokens=16)


def send(engine, persona, text, history=()):
    turn = engine.start_turn(persona, list(history), text)
    reply = "".join(turn.stream())
    assert turn.metrics.stop_reason != StopReason.ERROR, turn.metrics.error
    return turn, reply


def first_turn(engine, persona) -> list[ChatMessage]:
    """A fresh conversation with one turn in the context; its history."""
    engine.reset_context()
    engine.prepare_persona(persona)
    _, reply = send(engine, persona, FIRST)
    return [ChatMessage("user", FIRST), ChatMessage("assistant", reply)]


def test_typed_in_bursts_gives_the_plain_sends_prompt_and_reply(engine, persona):
    history = first_turn(engine, persona)
    plain, plain_reply = send(engine, persona, MESSAGE, history)
    assert plain.metrics.ahead_tokens == 0

    assert first_turn(engine, persona) == history
    reports = [engine.prefill_ahead(persona, history, draft) for draft in BURSTS]
    assert all(r is not None and r.ready == r.total - 1 for r in reports)
    ahead, ahead_reply = send(engine, persona, MESSAGE, history)
    m = ahead.metrics
    assert ahead_reply == plain_reply
    assert m.prompt_tokens == plain.metrics.prompt_tokens
    assert m.prefilled_tokens == 1, "only the prompt's last token is left for Enter"
    assert m.cached_tokens == m.prompt_tokens - 1
    # What the plain send prefilled after Enter was prefilled ahead instead; the
    # persona and the history in the context were never prefilled again.
    assert plain.metrics.prefilled_tokens - 1 <= m.ahead_tokens <= plain.metrics.prefilled_tokens
    assert m.ahead_ms > 0
    assert m.ahead_history_tokens == 0, "the history was in the context: only the message was typed ahead"


def test_history_prefilled_again_while_typing_is_not_counted_as_typed_ahead(engine, persona):
    # A model switch or a fork: the context holds the persona but not the conversation.
    history = first_turn(engine, persona)
    message = send(engine, persona, MESSAGE, history)[0].metrics
    engine.reset_context()
    engine.prepare_persona(persona)
    persona_only = send(engine, persona, FIRST)[0].metrics
    engine.reset_context()
    engine.prepare_persona(persona)
    report = engine.prefill_ahead(persona, history, MESSAGE)
    assert report is not None and report.ready == report.total - 1
    m = send(engine, persona, MESSAGE, history)[0].metrics
    typed = m.ahead_tokens - m.ahead_history_tokens
    # The history (first turn's prompt and reply, less the persona) went in
    # with the message; the message's own part is what a send with the
    # history in the context prefilled (its last token is left for Enter).
    assert m.ahead_history_tokens > persona_only.prefilled_tokens
    assert message.prefilled_tokens - 1 <= typed <= message.prefilled_tokens


def test_with_nothing_typed_the_history_is_prefilled_and_enter_pays_for_the_message(engine, persona):
    # The app does this at idle after a model switch, a fork or a branch switch:
    # an empty draft prefills what the prompt holds before the message.
    history = first_turn(engine, persona)
    in_context = send(engine, persona, MESSAGE, history)[0].metrics
    engine.reset_context()
    engine.prepare_persona(persona)
    report = engine.prefill_ahead(persona, history, "")
    assert report is not None and report.ready > 0
    m = send(engine, persona, MESSAGE, history)[0].metrics
    assert m.prompt_tokens == in_context.prompt_tokens
    # Enter prefilled the message, as with the history in the context, give or
    # take the few template tokens the empty message's prompt ended with.
    assert m.prefilled_tokens <= in_context.prefilled_tokens + 4
    assert m.ahead_history_tokens == m.ahead_tokens > 0  # all of it the history: nothing was typed


def test_a_draft_that_changes_completely_still_gives_the_right_prompt(engine, persona):
    engine.reset_context()
    engine.prepare_persona(persona)
    engine.prefill_ahead(persona, [], "Tell me a long story about dragons and castles.")
    turn, reply = send(engine, persona, "What is 2+2?")
    engine.reset_context(keep=persona)
    plain, plain_reply = send(engine, persona, "What is 2+2?")
    assert (turn.metrics.prompt_tokens, reply) == (plain.metrics.prompt_tokens, plain_reply)
    # Only the template tokens both prompts share after the persona were of use.
    long_draft = engine.fit_prompt(persona, [], "Tell me a long story about dragons and castles.", 16).tokens
    final = engine.fit_prompt(persona, [], "What is 2+2?", 16).tokens
    shared = next(i for i, (a, b) in enumerate(zip(long_draft, final, strict=False)) if a != b)
    assert turn.metrics.ahead_tokens == shared - len(engine.prefix_tokens(persona))


def test_a_turn_preempts_a_long_background_prefill_within_one_batch(engine, persona):
    engine.reset_context()
    engine.prepare_persona(persona)
    paste = "The quick brown fox jumps over the lazy dog. " * 120  # ~1,200 tokens
    started = threading.Event()
    batches_after_enter: list[int] = []
    entered = threading.Event()
    result = []

    def progress(ready, total):
        started.set()
        if entered.is_set():
            batches_after_enter.append(ready)

    worker = threading.Thread(
        target=lambda: result.append(engine.prefill_ahead(persona, [], paste, progress))
    )
    worker.start()
    assert started.wait(60)
    entered.set()
    turn, _ = send(engine, persona, "Hi")
    worker.join(60)
    report = result[0]
    assert report is None or report.ready < report.total - 1, "the paste was not finished"
    assert len(batches_after_enter) <= 1
    assert turn.metrics.stop_reason in (StopReason.EOS, StopReason.LENGTH)


def test_drop_ahead_stops_it_and_nothing_is_credited(engine, persona):
    engine.reset_context()
    engine.prepare_persona(persona)
    engine.prefill_ahead(persona, [], "Some draft that the user then deletes")
    engine.drop_ahead()
    engine.reset_context(keep=persona)  # what a new conversation does
    turn, _ = send(engine, persona, "Hello")
    assert turn.metrics.ahead_tokens == 0


def test_served_engines_cannot_prefill_ahead():
    from chatterm.core.config.catalog import ModelSpec, PriceProfile
    from chatterm.core.engine.remote import RemoteEngine

    spec = ModelSpec(id="s", price_profile="p", kind="openai", base_url="http://127.0.0.1:9/v1",
                     remote_model="m")
    engine = RemoteEngine(spec, PriceProfile(id="p", input_per_m=1, output_per_m=1, as_of="x"))
    assert not engine.capabilities.prefill_ahead
    persona = Workspace.load().personas.get("assistant")
    assert engine.prefill_ahead(persona, [], "hello") is None


def test_a_resumed_conversation_is_restored_while_typing_not_prefilled_again(engine, persona):
    # A relaunch: the conversation's state is on disk, the context holds only
    # the persona (prepared at launch). The first type-ahead restores the
    # conversation and prefills just the message; the turn reports that restore.
    history = first_turn(engine, persona)
    engine.keep_conversation(77)
    engine.wait_for_saves()
    engine.kv_cache.clear_ram()
    engine.reset_context()
    engine.prepare_persona(persona)
    engine.note_conversation(77)
    report = engine.prefill_ahead(persona, history, MESSAGE)
    assert report is not None and report.ready == report.total - 1
    m = send(engine, persona, MESSAGE, history)[0].metrics
    assert m.cache_outcome == "restored" and m.restore_at_switch, m.cache_detail
    assert "session 77, restored from disk before the message was sent" in m.cache_detail
    assert m.prefilled_tokens == 1
    assert m.ahead_history_tokens == 0
    # Typed ahead: the message only, after the restored conversation.
    assert 0 < m.ahead_tokens < m.prompt_tokens - len(engine.prefix_tokens(persona)) - 10


def stored_then_relaunched(engine, persona, session_id):
    """A conversation kept as `session_id` on disk, the context back to the persona
    alone (as at a relaunch); its history."""
    history = first_turn(engine, persona)
    engine.keep_conversation(session_id)
    engine.wait_for_saves()
    engine.kv_cache.clear_ram()
    engine.reset_context()
    engine.prepare_persona(persona)
    return history


def test_a_persona_switch_after_a_restore_while_typing_is_reported_as_the_switch(engine, persona):
    history = stored_then_relaunched(engine, persona, 78)
    assert engine.prefill_ahead(persona, history, MESSAGE) is not None
    other = greedy(Workspace.load().personas.get("terse-coder"), max_tokens=16)
    engine.prepare_persona(other)  # the context is the other persona's now
    assert engine.prefill_ahead(other, [], MESSAGE) is not None  # typed ahead there too
    m = send(engine, other, MESSAGE)[0].metrics
    # Its prefix made ready at the switch, not the first persona's conversation.
    assert "before the message was sent" not in m.cache_detail
    assert m.cache_outcome in ("restored", "switch") and m.ahead_tokens > 0
    assert m.cache_outcome == "switch" or m.restore_at_switch


def test_a_restore_that_fails_while_typing_leaves_the_turn_to_start_over(engine, persona, monkeypatch):
    from chatterm.core.engine.local import engine as local_engine

    history = stored_then_relaunched(engine, persona, 79)
    real = local_engine.kv_state.restore
    failures = []

    def failing(*args):  # every state is rejected, the persona's too: the context ends up empty
        failures.append(real(*args) or "forced failure")
        return failures[-1]

    monkeypatch.setattr(local_engine.kv_state, "restore", failing)
    assert engine.prefill_ahead(persona, history, MESSAGE) is None  # nothing prefilled in an empty context
    assert failures
    monkeypatch.setattr(local_engine.kv_state, "restore", real)
    m = send(engine, persona, MESSAGE, history)[0].metrics
    assert m.ahead_tokens == 0 and m.ahead_history_tokens == 0
    assert "before the message was sent" not in m.cache_detail


def test_a_branch_prefilled_at_idle_becomes_the_sessions_state(engine, persona):
    """After ← to another version, a persona switch away and back restored the
    session's last-turn branch (149 of 224 tokens) and prefilled the rest."""
    history = first_turn(engine, persona)
    engine.note_conversation(80)
    engine.keep_conversation(80)
    engine.wait_for_saves()
    other = [history[0], ChatMessage("assistant", "Another version of that reply, " * 12)]
    report = engine.prefill_ahead(persona, other, "", session_id=80)  # the version on screen, prefilled at idle
    assert report is not None and report.ready == report.total
    engine.wait_for_saves()
    engine.prepare_persona(greedy(Workspace.load().personas.get("terse-coder"), max_tokens=16))
    engine.prepare_persona(persona)  # and back
    engine.note_conversation(80)
    m = send(engine, persona, MESSAGE, other)[0].metrics
    assert "session 80" in m.cache_detail, m.cache_detail
    assert m.prompt_tokens - m.cached_tokens <= len(engine.llm.tokenize(MESSAGE.encode())) + 16, m.cache_detail


def test_a_history_prefilled_at_idle_is_not_kept_as_a_session_opened_meanwhile(engine, persona):
    """The worker for session 90's history can finish after session 91 was
    opened: keeping it as 91's state would make 91 prefill its history again."""
    history = first_turn(engine, persona)
    engine.note_conversation(91)
    engine.keep_conversation(91)
    engine.wait_for_saves()
    states = lambda key: {tuple(e.tokens) for e in engine.kv_cache.entries() if e.slot == Slot.session(key)}  # noqa: E731
    kept = states(91)
    assert len(kept) == 1  # in RAM and on disk
    other = [history[0], ChatMessage("assistant", "Another version of that reply, " * 12)]
    report = engine.prefill_ahead(persona, other, "", session_id=90)
    assert report is not None and report.ready == report.total  # prefilled, and not kept as 91's
    engine.wait_for_saves()
    assert states(91) == kept and states(90) == set()
