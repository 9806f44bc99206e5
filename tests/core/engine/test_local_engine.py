"""The local engine on the real default model: persona KV state, metrics, cancel, overflow."""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import threading
import time
from dataclasses import replace

import pytest

from chatterm.core.cache.prompt_cache import PromptCache
from chatterm.core.engine.context_window import KEEP_AFTER_CUT
from chatterm.core.engine.conversation import Conversation
from chatterm.core.engine.interface import ChatMessage, reply_room
from chatterm.core.engine.local.engine import LocalEngine
from chatterm.core.metrics.format import stop_label
from chatterm.core.store.session_store import SessionStore
from chatterm.core.workspace import Workspace
from chatterm.errors import ChattermError
from tests.conftest import greedy

QUESTION = "Write a Python function that reverses a string."


@pytest.fixture
def ws(tmp_path):
    return Workspace.load()


def make_engine(ws, model_id=None, kv_dir=None) -> LocalEngine:
    spec = ws.catalog.get(model_id)
    price = ws.catalog.price(spec.price_profile)
    cache = PromptCache(kv_dir or ws.kv_dir)
    engine = LocalEngine(spec, price, kv_cache=cache)
    engine.load()
    return engine


def run_turn(engine, persona, text=QUESTION, history=()):
    turn = engine.start_turn(persona, list(history), text)
    reply = "".join(turn.stream())
    assert turn.metrics.stop_reason != "error", turn.metrics.error
    return turn, reply


def turn_then_close(engine, persona):
    """One turn in a fresh engine, its state saved, the engine closed: what one `ask` process does."""
    try:
        turn, reply = run_turn(engine, persona)
        engine.wait_for_saves()
        return turn, reply
    finally:
        engine.close()


@pytest.fixture
def persona(ws):
    return greedy(ws.personas.get("terse-coder"), max_tokens=24)


def test_restored_state_gives_the_same_greedy_reply_and_prefills_only_user_tokens(ws, persona):
    cold_engine = make_engine(ws)
    try:
        cold, cold_reply = run_turn(cold_engine, persona)
        prefix_len = len(cold_engine.prefix_tokens(persona))
        cold_engine.wait_for_saves()
    finally:
        cold_engine.close()
    assert cold.metrics.cache_outcome == "cold"
    assert cold.metrics.cached_tokens == 0
    assert cold.metrics.prefilled_tokens == cold.metrics.prompt_tokens
    assert cold_reply.strip()

    fresh = make_engine(ws)  # a new process would see exactly this: a fresh context
    try:
        restored, restored_reply = run_turn(fresh, persona)
    finally:
        fresh.close()
    m = restored.metrics
    assert m.cache_outcome == "restored", m.cache_detail
    assert m.restore_ms is not None and m.restore_ms > 0
    assert restored_reply == cold_reply
    assert m.cached_tokens == prefix_len
    assert m.prefilled_tokens == m.prompt_tokens - prefix_len
    assert m.prefilled_tokens < 40  # only the user's message and the template's few tokens


def test_second_turn_reuses_the_conversation_prefix(ws, persona):
    engine = make_engine(ws)
    try:
        conversation = Conversation(engine, persona)
        first = conversation.send("What is a list in Python?")
        list(first.stream())
        second = conversation.send("And a tuple?")
        list(second.stream())
    finally:
        engine.close()
    m1, m2 = first.metrics, second.metrics
    assert m2.cache_outcome == "memory"
    # Everything from turn one (prompt and most of the reply) is reused.
    assert m2.cached_tokens >= m1.prompt_tokens
    assert m2.prefilled_tokens < m2.prompt_tokens - m1.prompt_tokens + 10
    assert [msg.role for msg in conversation.history] == ["user", "assistant"] * 2


def _rewrite_header(path, mutate):
    if path.suffix == ".kvchain":  # a chain record is one JSON object
        body = json.loads(path.read_text())
        mutate(body)
        path.write_text(json.dumps(body))
        return
    data = path.read_bytes()
    magic, version, hlen = struct.unpack("<12sII", data[:20])
    header = json.loads(data[20 : 20 + hlen])
    mutate(header)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<12sII", magic, version, len(blob)) + blob + data[20 + hlen :])


def _flip_payload_byte(path):
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 5000])


def _foreign_model(path):
    _rewrite_header(path, lambda h: h["compat"].update(model_sha256="0" * 64))


def _other_llama_build(path):
    _rewrite_header(path, lambda h: h["compat"].update(llama_cpp_build="f" * 64))


def _other_rope(path):
    _rewrite_header(path, lambda h: h["compat"]["rope"].update(freq_base="50000.0"))


def _garbage(path):
    path.write_bytes(b"definitely not a state file" * 10)


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_flip_payload_byte, "checksum"),
        (_truncate, "truncated"),
        (_foreign_model, "model sha256 differs"),
        (_other_llama_build, "llama cpp build differs"),
        (_other_rope, "rope differs"),
        (_garbage, "bad magic"),
    ],
)
def test_bad_state_files_are_rejected_and_rebuilt(ws, persona, damage, reason):
    engine = make_engine(ws)
    try:
        _, reference = run_turn(engine, persona)
        engine.wait_for_saves()
        path = _stored(engine, persona, header=damage in (_foreign_model, _other_llama_build, _other_rope))
        damage(path)
        engine.reset_context()  # as a fresh process would start: empty context,
        engine.kv_cache.clear_ram()  # nothing in RAM
        turn, reply = run_turn(engine, persona)
        assert turn.metrics.cache_outcome == "cold"
        assert reason in turn.metrics.cache_detail
        assert reply == reference  # the damaged file was never loaded
        engine.wait_for_saves()
        engine.reset_context()
        engine.kv_cache.clear_ram()
        again, again_reply = run_turn(engine, persona)
        assert again.metrics.cache_outcome == "restored"  # rewritten, valid again
        assert again_reply == reference
    finally:
        engine.close()


def test_mismatched_kv_settings_are_a_miss(ws, persona):
    engine = make_engine(ws)
    try:
        run_turn(engine, persona)
        engine.wait_for_saves()
    finally:
        engine.close()
    # Same model id and file, but a q8_0 KV cache with flash attention:
    # llama.cpp would reject or misread the f16 blob, so chatterm must not try.
    custom = replace(ws.catalog.get(None), kv_type="q8_0", flash_attn=True)
    ws.catalog.models[custom.id] = custom
    q8 = make_engine(ws)
    try:
        turn, _ = run_turn(q8, persona)
    finally:
        q8.close()
    assert turn.metrics.cache_outcome == "cold"
    detail = turn.metrics.cache_detail
    assert "flash attn differs" in detail or "type k differs" in detail, detail


@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_cache_restores_like_f16(ws, persona, kv_type):
    spec = replace(ws.catalog.get("smollm2-135m-q8kv"), id=f"smollm2-{kv_type}", kv_type=kv_type)
    ws.catalog.models[spec.id] = spec
    _, reply = turn_then_close(make_engine(ws, spec.id), persona)
    turn, again = turn_then_close(make_engine(ws, spec.id), persona)
    assert turn.metrics.cache_outcome == "restored", turn.metrics.cache_detail
    assert again == reply


def _stored(engine, persona, header: bool):
    """Where the persona's state is on disk: its chain record (compat, tokens)
    when `header`, else its last KV block (the payload)."""
    blocks = engine.kv_cache.blocks
    (chain,) = [c for c in blocks.disk_chains(engine.spec.id) if (c.kind, c.key) == ("persona", persona.id)]
    return chain.path if header else blocks.block_path(engine.spec.id, chain.segments[-1][0])


def test_state_file_layout_permissions_and_size(ws, persona):
    engine = make_engine(ws)
    try:
        run_turn(engine, persona)
        engine.wait_for_saves()
        record = _stored(engine, persona, header=True)
        body = json.loads(record.read_text())
        blocks = [engine.kv_cache.blocks.block_path(engine.spec.id, key) for key, _ in body["segments"]]
        prefix = engine.prefix_tokens(persona)
    finally:
        engine.close()
    assert all(p.read_bytes()[:12] == b"CHATTERM-KB\0" for p in blocks)
    assert record.stat().st_size + sum(p.stat().st_size for p in blocks) <= 1.01 * body["info"]["state_size"]
    for key in ("model_sha256", "llama_cpp_python", "llama_cpp_build", "architecture", "n_layer",
                "n_swa", "type_k", "type_v", "flash_attn", "rope"):
        assert key in body["compat"], key
    assert (body["kind"], body["key"]) == ("persona", persona.id)
    assert body["tokens"] == prefix  # an entry is identified by its exact tokens
    for path in (record, *blocks):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(record.parent.parent).st_mode) == 0o700
    assert not [p for p in record.parent.rglob("*") if p.name.endswith(".tmp")]


def test_metrics_agree_with_llama_perf_counters(ws):
    # A long cold prefill and a long reply keep Python overhead far below 5 %.
    persona = greedy(ws.personas.get("shop-support"), max_tokens=48)
    engine = make_engine(ws)
    try:
        engine.kv_cache = None
        turn = engine.start_turn(persona, [], "Tell me about your return policy in detail.")
        list(turn.stream())
    finally:
        engine.close()
    m, perf = turn.metrics, turn.perf
    assert m.generated_tokens >= 10, "need a few decode steps to compare rates"
    assert perf["n_p_eval"] == m.prefilled_tokens
    assert m.ttft_ms == pytest.approx(perf["t_p_eval_ms"], rel=0.05)
    llama_rate = perf["n_eval"] / (perf["t_eval_ms"] / 1000.0)
    assert m.decode_tok_s == pytest.approx(llama_rate, rel=0.05)


def test_cancel_keeps_partial_reply_and_context_stays_usable(ws):
    persona = greedy(ws.personas.get("assistant"), max_tokens=200)
    engine = make_engine(ws)
    try:
        conversation = Conversation(engine, persona)
        turn = conversation.send("Count from one to fifty in words.")
        pieces = []
        for delta in turn.stream():
            pieces.append(delta)
            if turn.metrics.generated_tokens == 5:
                turn.cancel()
        m = turn.metrics
        assert m.stop_reason == "cancelled"
        assert m.generated_tokens == 5  # stopped within one token
        assert turn.reply == "".join(pieces) and turn.reply
        assert conversation.history[-1] == ChatMessage("assistant", turn.reply)

        follow = conversation.send("Thanks. What is two plus two?")
        reply = "".join(follow.stream())
        assert follow.metrics.stop_reason in ("eos", "length")
        assert reply.strip()
        assert follow.metrics.cached_tokens >= m.prompt_tokens
    finally:
        engine.close()


def test_cancel_interrupts_a_long_prefill(ws):
    persona = greedy(ws.personas.get("shop-support"), max_tokens=8)
    engine = make_engine(ws)
    try:
        turn = engine.start_turn(persona, [], "Hello?")
        worker = threading.Thread(target=lambda: list(turn.stream()))
        worker.start()
        # Cancel once the first 512-token batch of the 2,365-token prefix is in:
        # the prefill is then provably under way and far from done.
        deadline = time.monotonic() + 120
        while engine.llm.n_tokens < 512 and worker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        turn.cancel()
        worker.join()
        assert turn.metrics.stop_reason == "cancelled"
        assert turn.metrics.generated_tokens == 0
        prefix = engine.prefix_tokens(persona)
        assert 512 <= engine.llm.n_tokens < len(prefix)  # aborted mid-prefill, not run to the end
        assert persona.id not in engine.cached_personas()  # a partial prefix is never saved
        # The turn's figures are what the prefill did before it stopped.
        m = turn.metrics
        assert m.prefilled_tokens == engine.llm.n_tokens and m.prompt_tokens > m.prefilled_tokens
        assert m.prefill_ms > 0 and m.saved_prefill_ms == 0
        # Charged for the tokens it went through, not for the prompt it never
        # reached (the next turn prefills those, and pays for them).
        price = ws.catalog.price(engine.spec.price_profile)
        assert m.unreached_tokens == m.prompt_tokens - m.prefilled_tokens
        assert m.cost_input_usd == pytest.approx(m.prefilled_tokens * price.input_per_m * 1e-6, abs=1e-6)

        small = greedy(ws.personas.get("terse-coder"))
        follow, reply = run_turn(engine, small)  # the context is usable afterwards
        assert reply.strip() and follow.metrics.stop_reason in ("eos", "length")
    finally:
        engine.close()


def test_a_first_turn_abandoned_before_any_text_makes_no_session_a_stopped_one_is_kept(ws, tmp_path):
    """Ctrl+C in `chatterm ask` during the prefill left an empty session
    (TTFT –, no reply) in `chatterm sessions`. A stop (Esc, a switch) keeps the
    message: the TUI shows it, and a switch back must find it."""
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=16)
    engine = make_engine(ws)
    try:
        with SessionStore(tmp_path / "stopped.db") as store:
            conversation = Conversation(engine, persona, store=store)
            first = conversation.send("Write a long essay about the sea.")
            first.abandon()  # before its first token
            assert "".join(first.stream()) == "" and first.metrics.stop_reason == "cancelled"
            assert store.sessions() == [] and conversation.session_id is None and conversation.history == []
            list(conversation.send("Hello?").stream())
            second = conversation.send("And the sea?")
            second.abandon()  # a later turn is recorded either way
            list(second.stream())
            (session,) = store.sessions()
            assert [t.user_text for t in store.turns(session.id)] == ["Hello?", "And the sea?"]
        with SessionStore(tmp_path / "esc.db") as store:
            conversation = Conversation(engine, persona, store=store)
            stopped = conversation.send("Write a long essay about the sea.")
            stopped.cancel()
            list(stopped.stream())
            (session,) = store.sessions()
            assert [t.user_text for t in store.turns(session.id)] == ["Write a long essay about the sea."]
    finally:
        engine.close()


def test_context_overflow_cuts_oldest_turns_deep_never_the_persona(ws, tmp_path):
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=16)
    small = replace(ws.catalog.get(None), id="tiny-ctx", n_ctx=512)
    ws.catalog.models[small.id] = small
    engine = make_engine(ws, "tiny-ctx")
    try:
        filler = "word " * 60  # ~60 tokens per message
        history = []
        for i in range(6):
            history += [ChatMessage("user", f"{i}: {filler}"), ChatMessage("assistant", f"ok {i}")]
        turn, reply = run_turn(engine, persona, "What is a dict?", history)
        m = turn.metrics
        assert m.dropped_turns >= 1 and m.cut_turns == m.dropped_turns
        assert any("oldest" in n and "left the model's context" in n for n in turn.notices)
        budget = 512 - reply_room(16, 512)
        assert m.prompt_tokens <= budget
        # Cut deep, to about half the budget, so the next turns fit as they are.
        kept_one_more = engine._prompt_tokens(persona, history[2 * (m.dropped_turns - 1):], "What is a dict?")
        assert len(kept_one_more) > budget * KEEP_AFTER_CUT - 16
        prefix = engine.prefix_tokens(persona)
        assert engine.llm.input_ids[: len(prefix)].tolist() == prefix  # persona kept

        # The cut holds: the next turn leaves out the same turns, none more.
        history += [ChatMessage("user", "What is a dict?"), ChatMessage("assistant", reply)]
        fitted = engine.fit_prompt(persona, history, "And a list?", 16)
        assert fitted.dropped_turns == m.dropped_turns and fitted.moved_turns == 0

        huge, _ = run_turn(engine, persona, "tell me " * 3000)
        assert huge.metrics.stop_reason in ("eos", "length")
        assert any("kept its last" in n for n in huge.notices)
    finally:
        engine.close()


def test_a_reply_that_fills_the_context_says_so_not_max_tokens(ws):
    persona = greedy(ws.personas.get("terse-coder"), max_tokens=1000)
    small = replace(ws.catalog.get(None), id="tiny-ctx", n_ctx=256)
    ws.catalog.models[small.id] = small
    engine = make_engine(ws, "tiny-ctx")
    try:
        turn, _ = run_turn(engine, persona, "Write a long essay about the history of Rome, with many details.")
    finally:
        engine.close()
    m = turn.metrics
    assert m.prompt_tokens + m.generated_tokens == 256
    assert m.stop_reason == "context" and stop_label(m) == "context full"


def test_a_persona_too_large_for_the_context_is_one_line_before_anything_is_prefilled(ws, persona, tmp_path):
    large = ws.personas.get("shop-support")  # about 2,400 tokens
    small = replace(ws.catalog.get(None), id="tiny-ctx", n_ctx=1024)
    ws.catalog.models[small.id] = small
    engine = make_engine(ws, "tiny-ctx")
    try:
        with pytest.raises(ChattermError) as refused:
            engine.prepare_persona(large)  # was "llama_decode returned 1"
        said = str(refused.value)
        assert re.fullmatch(
            r"persona 'shop-support' is \d,\d{3} tokens: with room for a message and a reply \(\d+ tokens\) "
            r"it does not fit the 1,024-token context of model 'tiny-ctx'; raise the model's n_ctx in "
            r"models\.toml, or shorten the persona", said), said
        assert engine.context_used() == 0
        assert f"is {len(engine.prefix_tokens(large)):,} tokens" in said  # as the dashboard counts it
        with SessionStore(tmp_path / "chat.db") as store:
            turn = Conversation(engine, large, store).send("Where is my order?")
            assert "".join(turn.stream()) == ""
            assert turn.metrics.stop_reason == "error" and turn.metrics.error == said
            assert store.sessions() == []  # no session of one failed turn without text
            conversation = Conversation(engine, persona, store)  # a persona that fits: fine
            list(conversation.send(QUESTION).stream())
            assert conversation.history[-1].content.strip()
            assert [s.id for s in store.sessions()] == [conversation.session_id]
    finally:
        engine.close()


def test_unwritable_cache_folder_chat_goes_on_and_says_so_once(ws, persona, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder should be")
    engine = make_engine(ws, kv_dir=blocked / "kv")
    try:
        first, reply = run_turn(engine, persona)
        engine.wait_for_saves()
        second, _ = run_turn(engine, persona, "And in Rust?")
        engine.reset_context()
        third, _ = run_turn(engine, persona, "And in Go?")
    finally:
        engine.close()
    assert reply.strip()
    notices = first.notices + second.notices + third.notices
    assert sum("Prompt cache on disk off" in n for n in notices) == 1
    # No disk, but the RAM tier still serves the persona prefix within this process.
    assert third.metrics.cache_outcome == "restored"
    assert "restored from RAM" in third.metrics.cache_detail


def test_prepare_persona_restores_at_switch_time(ws, persona):
    engine = make_engine(ws)
    try:
        run_turn(engine, persona)
        engine.wait_for_saves()
        other = greedy(ws.personas.get("assistant"))
        run_turn(engine, other, "hi")  # the context now holds another persona
        assert engine.cached_personas() == {persona.id: "ram", other.id: "ram"}  # RAM before disk
        report = engine.prepare_persona(persona)
        assert report.outcome == "restored" and report.ms > 0
        turn, _ = run_turn(engine, persona)
        assert turn.metrics.cache_outcome == "restored"
        assert turn.metrics.restore_ms == report.ms
    finally:
        engine.close()
    fresh = make_engine(ws)  # a new process: only the disk tier
    try:
        assert fresh.cached_personas() == {persona.id: "disk", other.id: "disk"}
    finally:
        fresh.close()


def test_a_first_use_prefill_reports_its_progress(ws, persona, tmp_path):
    engine = make_engine(ws, kv_dir=tmp_path / "kv")  # nothing cached: a cold prefill
    seen, after = [], []
    try:
        report = engine.prepare_persona(persona, progress=seen.append)
        # Another persona next: its prefix starts as this one's does (the
        # template's opening, kept in the context), and the progress counts the
        # whole prefix, as the report does, not only the tokens after those.
        other = ws.personas.get("shop-support")
        second = engine.prepare_persona(other, progress=after.append)
        tokens = len(engine.prefix_tokens(other))
    finally:
        engine.close()
    assert report.outcome == "cold" and seen
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert seen[-1].done == seen[-1].total == report.tokens and seen[-1].rate > 0
    assert second.outcome == "cold" and after[-1].done == after[-1].total == second.tokens == tokens


def test_missing_and_corrupt_gguf_are_one_line_errors(ws, tmp_path):
    missing = replace(ws.catalog.get(None), id="missing", source=str(tmp_path / "nope.gguf"))
    bogus_path = tmp_path / "bogus.gguf"
    bogus_path.write_bytes(b"this is not a model" * 100)
    bogus = replace(missing, id="bogus", source=str(bogus_path))
    truncated_path = tmp_path / "truncated.gguf"
    truncated_path.write_bytes(ws.catalog.get(None).model_path().read_bytes()[:50_000_000])
    truncated = replace(missing, id="truncated", source=str(truncated_path))
    for spec, words in ((missing, "not found"), (bogus, "not a GGUF"), (truncated, "not within the file bounds")):
        engine = LocalEngine(spec, ws.catalog.price(spec.price_profile))
        with pytest.raises(ChattermError) as info:
            engine.load()
        message = str(info.value)
        assert str(spec.model_path()) in message and words in message
        assert "\n" not in message


def test_the_device_name_is_probed_once_at_load(ws, monkeypatch):
    import chatterm.core.engine.local.model as llama_model

    probes = []
    for name in ("cpu_name", "_gpu_name"):
        probe = getattr(llama_model, name)
        monkeypatch.setattr(llama_model, name, lambda probe=probe: probes.append(probe) or probe())
    engine = make_engine(ws)
    try:
        names = {engine.device().name for _ in range(3)}
    finally:
        engine.close()
    assert len(probes) == 1 and names == {probes[0]()} and names != {""}


@pytest.mark.parametrize(
    ("gpu_device", "n_gpu_layers", "warms_up"),
    [(False, "auto", False), (True, "auto", True), (True, 0, False)],
    ids=["cpu-build", "layers-on-gpu", "gpu-device-no-layers"],
)
def test_only_a_model_with_layers_on_a_gpu_warms_up(ws, monkeypatch, gpu_device, n_gpu_layers, warms_up):
    # On the CPU a warm-up saves turn one little against what it costs at
    # every load (docs/engine.md): a model on the CPU decodes nothing before
    # turn one. A CPU build ignores the offload, so "layers-on-gpu" only
    # checks the decision, not a GPU.
    import chatterm.core.engine.local.model as llama_model

    monkeypatch.setattr(llama_model.llama_cpp, "llama_supports_gpu_offload", lambda: gpu_device)
    spec = replace(ws.catalog.get(None), n_gpu_layers=n_gpu_layers)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(ws.kv_dir))
    engine.load()
    try:
        perf = llama_model.llama_cpp.llama_perf_context(engine.llm.ctx)
        # llama.cpp reports at least 1 for each count; the warm-up decodes 8 + 1.
        decoded = perf.n_p_eval + perf.n_eval
        assert engine.context_used() == 0
    finally:
        engine.close()
    assert (decoded > 2) is warms_up


class GatedPrepare:
    """prepare_persona in a thread, held after its first batch until `release()`:
    the real prefill is provably under way (and holds the engine) meanwhile."""

    def __init__(self, engine, persona):
        self.in_progress = threading.Event()
        self.gate = threading.Event()
        self.report = None

        def progress(_p):
            self.in_progress.set()
            self.gate.wait(timeout=300)

        def run():
            self.report = engine.prepare_persona(persona, progress)

        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.in_progress.wait(timeout=120), "the persona prefill did not start"

    def release(self):
        self.gate.set()
        self.thread.join()


def test_cancel_while_a_persona_prefill_holds_the_engine_stops_at_once(ws, tmp_path):
    from chatterm.core.metrics.format import cache_label, footer_line

    persona = greedy(ws.personas.get("shop-support"), max_tokens=8)
    engine = make_engine(ws, kv_dir=tmp_path / "kv")  # nothing cached: a first-use prefill
    try:
        prepare = GatedPrepare(engine, persona)
        try:
            turn = engine.start_turn(persona, [], "Do you sell tents?")
            worker = threading.Thread(target=lambda: list(turn.stream()))
            worker.start()
            turn.cancel()
            worker.join(timeout=60)  # a guard, not a timing claim: the prefill is held
            assert not worker.is_alive(), "the turn waited for the persona prefill"
            assert prepare.thread.is_alive()
        finally:
            prepare.release()
        m = turn.metrics
        assert m.stop_reason == "cancelled" and m.cache_outcome == "none"
        assert "shop-support" in m.cache_detail and "waiting" in m.cache_detail
        assert m.wait_ms > 0
        assert (m.prompt_tokens, m.cached_tokens, m.prefill_ms, m.saved_prefill_ms, m.saved_usd) == (0, 0, 0, 0, 0)
        assert cache_label(m) == "stopped while waiting"
        assert "prefill" not in footer_line(m) and footer_line(m).endswith("stopped while waiting")

        # The persona prefill went on to the end, and the next turn reuses it.
        prefix = engine.prefix_tokens(persona)
        assert prepare.report.outcome == "cold" and prepare.report.tokens == len(prefix)
        assert persona.id in engine.cached_personas()
        follow, reply = run_turn(engine, persona, "Do you sell tents?")
        assert follow.metrics.cache_outcome == "switch" and follow.metrics.cached_tokens >= len(prefix)
        assert reply.strip()
    finally:
        engine.close()


def test_a_persona_prefilled_at_the_switch_is_charged_and_not_saved(ws, tmp_path):
    persona = greedy(ws.personas.get("shop-support"), max_tokens=8)
    engine = make_engine(ws, kv_dir=tmp_path / "kv")
    try:
        prepare = GatedPrepare(engine, persona)
        try:
            turn = engine.start_turn(persona, [], "Do you sell tents?")
            worker = threading.Thread(target=lambda: list(turn.stream()))
            worker.start()  # Enter during the persona prefill: the turn waits for it
        finally:
            prepare.release()
        worker.join()
        m = turn.metrics
        assert m.stop_reason != "error", m.error
        assert m.cache_outcome == "switch"
        assert m.wait_ms > 0 and m.cached_tokens > 2000
        # Its note says so too: it reads like a reuse of the live context otherwise.
        assert m.cache_detail.startswith("prefilled for this turn before it was sent, with the persona: "
                                         f"{m.cached_tokens:,} of {m.prompt_tokens:,} tokens"), m.cache_detail
        assert m.cache_detail.endswith("none reused from a cache")
        # Prefilled at the switch for this turn: new work, charged as input, nothing saved.
        assert m.reused_tokens == 0 and m.saved_prefill_ms == 0 and m.saved_usd == 0
        assert m.cost_cached_input_usd == 0 and m.cost_input_usd > 2000 * 1e-6

        # Restored at a switch before the next send: nothing waited for, the reuse is saved.
        engine.reset_context()
        assert engine.prepare_persona(persona).outcome == "restored"
        later, _ = run_turn(engine, persona, "Do you sell tents?")
        assert later.metrics.restore_at_switch
        assert later.metrics.saved_prefill_ms > 0
    finally:
        engine.close()


def test_a_slow_rate_stored_with_a_state_does_not_inflate_a_fresh_process_estimate(ws, tmp_path):
    persona = greedy(ws.personas.get("assistant"))
    kv_dir = tmp_path / "kv"
    first = make_engine(ws, kv_dir=kv_dir)
    # As if the persona had been prefilled while another process kept the CPU busy.
    first._rate.measured = lambda ms, tokens: first._rate.adopt(10_000.0)
    try:
        run_turn(first, persona, "Name a color.")
        first.wait_for_saves()
    finally:
        first.close()
    fresh = make_engine(ws, kv_dir=kv_dir)
    try:
        turn, _ = run_turn(fresh, persona, "Name a color that you like, and say why in one short sentence.")
    finally:
        fresh.close()
    m = turn.metrics
    assert m.cache_outcome == "restored" and m.prefilled_tokens >= 8, m.cache_detail
    # This turn's own prefill rate (prefill_ms runs to the first token, so it is an upper bound).
    assert 0 < m.saved_prefill_ms <= m.cached_tokens * m.prefill_ms / m.prefilled_tokens


def test_a_fresh_process_estimates_saved_prefill_from_the_restored_state(ws, tmp_path):
    persona = greedy(ws.personas.get("assistant"))  # a short prefix: no long prefill to measure
    kv_dir = tmp_path / "kv"
    first = make_engine(ws, kv_dir=kv_dir)
    try:
        run_turn(first, persona, "Name a color.")
        first.wait_for_saves()
    finally:
        first.close()
    for prepare in (False, True):
        fresh = make_engine(ws, kv_dir=kv_dir)
        try:
            if prepare:  # the TUI: restored at the persona switch, before the turn
                assert fresh.prepare_persona(persona).outcome == "restored"
            turn, _ = run_turn(fresh, persona, "Name a color.")
        finally:
            fresh.close()
        m = turn.metrics
        assert m.cache_outcome == "restored", m.cache_detail
        assert m.saved_usd > 0
        assert m.saved_prefill_ms > 0, "the restored state's prefill rate gives an estimate"


def _sized_engine(ws, n_ctx) -> LocalEngine:
    spec = replace(ws.catalog.get(None), n_ctx=n_ctx)
    engine = LocalEngine(spec, ws.catalog.price(spec.price_profile), kv_cache=PromptCache(ws.kv_dir))
    engine.load()
    return engine


def test_a_state_from_a_one_turn_context_restores_in_the_whole_context(ws, persona):
    # a short turn's context, as `chatterm ask` allocates it, then the model's 8k, as the TUI loads it
    cold, cold_reply = turn_then_close(_sized_engine(ws, 1024), persona)
    assert cold.metrics.cache_outcome == "cold"
    restored, reply = turn_then_close(make_engine(ws), persona)
    assert restored.metrics.cache_outcome == "restored", restored.metrics.cache_detail
    assert reply == cold_reply


def test_sampled_replies_vary_unless_the_persona_pins_a_seed(ws):
    """A regenerate asks the same prompt again: at temperature > 0 it must be
    able to give a different reply, and a pinned seed must give the same one;
    the seed a reply records, pinned, samples that reply again."""
    base = ws.personas.get("assistant")
    sampled = replace(base, sampling=replace(base.sampling, temperature=1.0, max_tokens=24))
    pinned = replace(sampled, sampling=replace(sampled.sampling, seed=7))
    prompt = "Invent a name for a new color and describe it."
    engine = make_engine(ws)
    try:
        runs = [run_turn(engine, sampled, prompt) for _ in range(3)]
        fixed = {run_turn(engine, pinned, prompt)[1] for _ in range(2)}
        first, first_reply = runs[0]
        replayed = replace(sampled, sampling=replace(sampled.sampling, seed=first.metrics.seed))
        again = run_turn(engine, replayed, prompt)
    finally:
        engine.close()
    assert len({reply for _, reply in runs}) > 1, runs
    assert len(fixed) == 1, fixed
    assert again[1] == first_reply and again[0].metrics.seed == first.metrics.seed


def test_a_whole_state_too_large_for_a_small_context_is_skipped_and_kept(ws, monkeypatch):
    from chatterm.core.cache import prompt_cache
    from chatterm.core.config.personas import Persona, Sampling

    def whole_states_only(payload):  # as for a model whose states do not split into blocks
        raise prompt_cache.LayoutError("test: whole states")

    monkeypatch.setattr(prompt_cache.state_layout, "parse", whole_states_only)
    text = " ".join(f"Rule {i}: answer briefly, name the source, and keep the user's terms." for i in range(40))
    sampling = Sampling(temperature=0.0, max_tokens=8)
    long = Persona(id="long", system_prompt=text, sampling=sampling)
    short = Persona(id="short", system_prompt=text[:400], sampling=sampling)

    engine = make_engine(ws)
    try:
        run_turn(engine, long, "Hi.")
        engine.wait_for_saves()
        n_long = len(engine.prefix_tokens(long))
    finally:
        engine.close()
    assert n_long > 512

    small = _sized_engine(ws, 512)
    try:
        turn, _ = run_turn(small, short, "Hi.")
    finally:
        small.close()
    assert turn.metrics.cache_outcome == "cold"
    assert "do not fit this 512-token context" in turn.metrics.cache_detail, turn.metrics.cache_detail
    # Not discarded: the whole context still restores it.
    assert any(e.slot.kind == "persona" and len(e.tokens) == n_long for e in PromptCache(ws.kv_dir).entries())
    again = make_engine(ws)
    try:
        restored, _ = run_turn(again, long, "Hi.")
    finally:
        again.close()
    assert restored.metrics.cache_outcome == "restored", restored.metrics.cache_detail
