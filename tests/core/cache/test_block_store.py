"""The block tier of the prompt cache, through `PromptCache`: sharing, what a save
writes, budgets and eviction, damaged blocks, and today's whole-state files.

States here are built in llama.cpp's sequence layout (`fake_state`: two layers,
V transposed) so that no model is needed; tests/core/cache/test_state_layout.py
and test_conversation_cache.py do the same on real models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fake_states import BPT, fake_state

from chatterm.core.cache import state_file, state_layout
from chatterm.core.cache.prompt_cache import DISK, RAM, Miss, OpenedState, PromptCache, Slot

REPO = Path(__file__).resolve().parents[3]
COMPAT = {"model_sha256": "ab" * 32, "llama_cpp_build": "cd" * 32, "type_k": 1}
PERSONA = Slot.persona("shop")


def toks(n: int, start: int = 1) -> list[int]:
    return [(start + i) % 40000 for i in range(n)]


def disk_block_bytes(folder: Path, model: str = "m") -> int:
    return sum(p.stat().st_size for p in (folder / model / "blocks").glob("*.kvblock"))


def restored(cache: PromptCache, prompt, expect=()) -> tuple[list[int], bytes] | Miss:
    found = cache.lookup("m", COMPAT, prompt, expect=expect)
    if not found.candidates:
        return Miss("; ".join(found.misses) or "none")
    opened = cache.open(found.candidates[0])
    if isinstance(opened, Miss):
        return opened
    try:
        if opened.verify is not None and not opened.verify():
            return Miss("checksum")
        return opened.tokens, bytes(opened.payload)
    finally:
        opened.close()


def test_a_state_is_stored_as_blocks_and_restores_exactly_its_prefix(tmp_path):
    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    tokens = toks(300)
    path = cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    assert path == cache.blocks.record_path("m", "session", "1")
    assert not cache.path_for("m", Slot.session(1)).exists()
    assert len(list((tmp_path / "kv" / "m" / "blocks").iterdir())) == 5  # 4 x 64 + 44
    prompt = tokens[:150] + [99_999]
    got = restored(PromptCache(tmp_path / "kv"), prompt)
    assert got == (tokens[:150], bytes(fake_state(tokens[:150])))  # 2 blocks and 22 tokens of the third


def test_the_disk_writer_takes_blocks_the_ram_tier_holds_instead_of_splitting_again(tmp_path, monkeypatch):
    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    tokens = toks(300)
    state = fake_state(tokens)
    split = state_layout.split
    asked: list[list[tuple[int, int]]] = []

    def counting_split(payload, layout, ranges):
        asked.append(list(ranges))
        return split(payload, layout, ranges)

    monkeypatch.setattr(state_layout, "split", counting_split)
    cache.put("m", Slot.session(1), tokens, state, COMPAT)
    cache.flush()
    # The first state of a (model, compat) is split once to check its layout,
    # once for the RAM tier's blocks, and the writer splits nothing more.
    assert len(asked) == 2
    assert asked[-1] == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 300)]
    got = restored(PromptCache(tmp_path / "kv"), tokens + [7])  # the disk copy, in a fresh cache
    assert got == (tokens, bytes(state))


def test_two_sessions_of_a_persona_store_its_blocks_once(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    persona = toks(2000)
    cache.save("m", PERSONA, persona, fake_state(persona), COMPAT)
    own = 0
    for session in range(1, 4):
        tokens = persona + toks(150 + 10 * session, start=1000 * session)
        cache.save("m", Slot.session(session), tokens, fake_state(tokens), COMPAT)
        own += len(tokens) - len(persona)
    stored = disk_block_bytes(tmp_path / "kv")
    assert stored <= 1.1 * (len(persona) + own) * BPT
    assert stored >= (len(persona) + own) * BPT
    (usage,) = cache.usage()
    assert usage.bytes_per_token == BPT and usage.chains == 4
    assert usage.shared_bytes >= len(persona) * BPT
    for session in range(1, 4):  # every session still restores whole
        tokens = persona + toks(150 + 10 * session, start=1000 * session)
        assert restored(PromptCache(tmp_path / "kv"), tokens + [7]) == (tokens, bytes(fake_state(tokens)))


def test_a_turn_writes_only_its_new_tokens_and_a_fork_shares_up_to_the_fork(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    tokens = toks(500)
    cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    for _ in range(3):
        before = disk_block_bytes(tmp_path / "kv")
        tokens = tokens + toks(37, start=len(tokens) * 3)
        cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
        written = disk_block_bytes(tmp_path / "kv") - before
        assert 37 * BPT <= written <= 37 * BPT + 4096
    record = cache.blocks.record_path("m", "session", "1")
    assert record.stat().st_size < 64 << 10
    # A fork in the middle of a block uses that block's first tokens.
    before = disk_block_bytes(tmp_path / "kv")
    fork = tokens[:300] + toks(20, start=30_000)
    cache.save("m", Slot.session(2), fork, fake_state(fork), COMPAT)
    assert disk_block_bytes(tmp_path / "kv") - before <= 20 * BPT + 4096
    assert restored(PromptCache(tmp_path / "kv"), fork + [1]) == (fork, bytes(fake_state(fork)))
    assert restored(PromptCache(tmp_path / "kv"), tokens + [1]) == (tokens, bytes(fake_state(tokens)))


def test_ram_tier_holds_blocks_within_its_budget_and_evicts_from_the_ends_of_chains(tmp_path):
    persona = toks(256)
    budget = (256 + 3 * 128) * BPT
    cache = PromptCache(tmp_path / "kv", ram_budget_bytes=budget)
    cache.put("m", PERSONA, persona, fake_state(persona), COMPAT, disk=False)
    for session in range(1, 6):
        tokens = persona + toks(128, start=1000 * session)
        cache.put("m", Slot.session(session), tokens, fake_state(tokens), COMPAT, disk=False)
    held = sum(len(b.piece) for b in cache.blocks._ram_blocks.values())
    assert held <= budget
    # The persona's blocks stay (every kept session needs them); the oldest
    # sessions lost their own block, the newest kept theirs.
    for session, whole in ((1, False), (2, False), (4, True), (5, True)):
        tokens = persona + toks(128, start=1000 * session)
        found = cache.lookup("m", COMPAT, tokens + [3], expect=[Slot.session(session)])
        best = found.candidates[0]
        assert best.entry.tier == RAM
        assert best.shared == (len(tokens) if whole else len(persona))
        if not whole:
            assert f"session {session} (ram): blocks evicted after 256 of 384 tokens" in found.misses
    assert cache.lookup("m", COMPAT, persona + [3]).candidates[0].shared == len(persona)


def test_disk_tier_keeps_its_budget_by_block_and_chains_stay_usable_up_to_what_is_left(tmp_path):
    persona = toks(256)
    budget = int((256 + 2.5 * 128) * BPT)
    cache = PromptCache(tmp_path / "kv", disk_budget_bytes=budget)
    cache.save("m", PERSONA, persona, fake_state(persona), COMPAT)
    for session in range(1, 5):
        tokens = persona + toks(128, start=1000 * session)
        cache.save("m", Slot.session(session), tokens, fake_state(tokens), COMPAT)
    assert disk_block_bytes(tmp_path / "kv") <= budget
    fresh = PromptCache(tmp_path / "kv")
    for session, whole in ((1, False), (3, True), (4, True)):
        tokens = persona + toks(128, start=1000 * session)
        best = fresh.lookup("m", COMPAT, tokens + [1]).candidates[0]
        assert best.shared == (len(tokens) if whole else len(persona))
    latest = persona + toks(128, start=4000)
    assert restored(fresh, latest + [1]) == (latest, bytes(fake_state(latest)))


def test_damaged_truncated_and_foreign_blocks_are_misses_with_their_reason(tmp_path):
    tokens = toks(200)
    cache = PromptCache(tmp_path / "kv", block_tokens=128)
    cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    blocks = sorted((tmp_path / "kv" / "m" / "blocks").iterdir(), key=lambda p: p.stat().st_size)
    small, big = blocks  # 72 and 128 tokens
    prompt = tokens + [5]

    data = bytearray(big.read_bytes())
    data[-10] ^= 1
    big.write_bytes(bytes(data))
    assert restored(PromptCache(tmp_path / "kv"), prompt) == Miss("checksum")
    checks = PromptCache(tmp_path / "kv").verify_files()
    assert [c.detail for c in checks if not c.ok] == ["payload sha256 mismatch"]

    big.write_bytes(bytes(data[:-300]))
    miss = restored(PromptCache(tmp_path / "kv"), prompt)
    assert isinstance(miss, Miss) and "truncated" in miss.reason and not big.exists()  # deleted: rebuilt later

    cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)  # rebuilt
    small.rename(big)  # a block under another block's name
    miss = restored(PromptCache(tmp_path / "kv"), prompt)
    assert isinstance(miss, Miss) and "foreign block" in miss.reason

    cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    record = cache.blocks.record_path("m", "session", "1")
    body = json.loads(record.read_text())
    body["tokens"][3] += 1  # the record no longer names its blocks' tokens
    record.write_text(json.dumps(body))
    miss = restored(PromptCache(tmp_path / "kv"), body["tokens"] + [5])
    assert isinstance(miss, Miss) and "foreign block" in miss.reason


@pytest.mark.parametrize("bad", [True, 2**31, -(2**31) - 1, 1.0, None, "7"])
def test_a_chain_record_with_a_token_that_is_no_int32_is_a_miss_with_its_reason(tmp_path, bad):
    cache = PromptCache(tmp_path / "kv")
    tokens = toks(300)
    cache.save("m", PERSONA, tokens, fake_state(tokens), COMPAT)
    (record,) = (tmp_path / "kv" / "m").glob("*.kvchain")
    body = json.loads(record.read_text())
    body["tokens"][5] = bad
    record.write_text(json.dumps(body))
    found = PromptCache(tmp_path / "kv").lookup("m", COMPAT, tokens + [9])
    assert found.candidates == []
    assert any("corrupt chain record (tokens or segments)" in m for m in found.misses), found.misses


def test_todays_whole_state_files_are_read_and_become_blocks_when_saved_again(tmp_path):
    tokens = toks(200)
    folder = tmp_path / "kv"
    cache = PromptCache(folder)
    old = cache.path_for("m", Slot.session(1))
    old.parent.mkdir(parents=True)
    meta = {"kind": "session", "key": "1", "model_id": "m"}
    state_file.write(old, tokens, COMPAT, fake_state(tokens), meta)  # as the previous version wrote it
    (entry,) = PromptCache(folder).entries()
    assert entry.chain is None and entry.tier == DISK and not entry.problem
    got = restored(PromptCache(folder), tokens + [1])
    assert got == (tokens, bytes(fake_state(tokens)))  # whole-state files still restore
    longer = tokens + toks(10, start=9000)
    cache.save("m", Slot.session(1), longer, fake_state(longer), COMPAT)
    assert not old.exists()
    (entry,) = PromptCache(folder).entries()
    assert entry.chain is not None and entry.tokens == longer


def test_cache_ls_shows_bytes_per_token_blocks_and_shared_bytes(tmp_path):
    cache = PromptCache(tmp_path / "cache" / "kv")
    persona = toks(300)
    cache.save("smollm2-135m", PERSONA, persona, fake_state(persona), COMPAT)
    for session in (1, 2):
        tokens = persona + toks(40, start=500 * session)
        cache.save("smollm2-135m", Slot.session(session), tokens, fake_state(tokens), COMPAT)
    env = {"CHATTERM_CONFIG_DIR": str(tmp_path / "config"), "CHATTERM_DATA_DIR": str(tmp_path / "data"),
           "CHATTERM_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO),
           "PATH": "/usr/bin:/bin"}  # piped with no COLUMNS: exact bytes
    out = subprocess.run([sys.executable, "-m", "chatterm", "cache", "ls"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"{BPT:,}" in out.stdout and "shared" in out.stdout
    (usage,) = cache.usage()
    assert f"{usage.shared_bytes:,}" in out.stdout and f"{usage.bytes:,}" in out.stdout
    verify = subprocess.run([sys.executable, "-m", "chatterm", "cache", "verify"], capture_output=True,
                            text=True, env=env, timeout=120)
    assert verify.returncode == 0, verify.stdout
    assert f"{usage.blocks + 3} of {usage.blocks + 3}" in verify.stdout


def test_a_ram_chain_restores_without_disk(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    tokens = toks(130)
    cache.put("m", Slot.session(1), tokens, fake_state(tokens), COMPAT, disk=False)
    found = cache.lookup("m", COMPAT, tokens + [1])
    (best,) = found.candidates
    assert best.entry.tier == RAM and best.entry.chain is not None
    opened = cache.open(best)
    assert isinstance(opened, OpenedState) and opened.verify is None
    assert bytes(opened.payload) == bytes(fake_state(tokens))
    opened.close()


def test_restores_reuse_one_assembly_buffer_through_clear_ram_and_a_longer_conversation(tmp_path):
    """Fresh memory costs more than the join into it: the buffer a restore
    assembled into serves the next restore, after clear_ram and when the
    conversation has grown a little, and each restore still gives its bytes."""
    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    buffers = []
    for n in (130, 150, 160):  # a conversation a turn longer each time
        tokens = toks(n)
        cache.put("m", Slot.session(1), tokens, fake_state(tokens), COMPAT, disk=False)
        (best,) = cache.lookup("m", COMPAT, tokens + [1]).candidates
        opened = cache.open(best)
        assert bytes(opened.payload) == bytes(fake_state(tokens))
        buffers.append(opened.payload.obj)
        opened.close()
        cache.clear_ram()
    assert buffers[0] is buffers[1] is buffers[2]


def test_a_restore_coming_gets_its_memory_reserved_and_assembles_into_it(tmp_path):
    """`reserve` (run while the model loads) grows the assembly buffer to the
    slot's chain on disk, so the restore that follows, in a new process, writes
    into memory already faulted in; a slot with nothing on disk reserves nothing."""
    tokens = toks(300)
    PromptCache(tmp_path / "kv", block_tokens=64).save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    cache = PromptCache(tmp_path / "kv", block_tokens=64)  # a new process
    assert cache.reserve("m", Slot.session(2)) == 0
    assert cache.reserve("other-model", Slot.session(1)) == 0
    reserved = cache.reserve("m", Slot.session(1))
    assert reserved >= len(fake_state(tokens))
    buffer = cache.blocks._scratch
    assert cache.reserve("m", Slot.session(1)) == reserved, "a second reserve keeps the buffer"
    assert cache.blocks._scratch is buffer
    (best,) = cache.lookup("m", COMPAT, tokens + [1]).candidates
    opened = cache.open(best)
    try:
        assert opened.verify is not None and opened.verify()
        assert bytes(opened.payload) == bytes(fake_state(tokens))
        assert opened.payload.obj is buffer
    finally:
        opened.close()


def test_a_restore_while_its_memory_is_reserved_waits_for_that_buffer(tmp_path, monkeypatch):
    """An assembly that starts while `reserve` is still faulting the buffer in
    takes that buffer when it is ready, rather than faulting in a second one."""
    import threading

    from chatterm.core.cache import block_store

    tokens = toks(300)
    PromptCache(tmp_path / "kv", block_tokens=64).save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    (best,) = cache.lookup("m", COMPAT, tokens + [1]).candidates
    allocating, release = threading.Event(), threading.Event()
    real_bytearray = bytearray

    def slow_bytearray(*args):
        if args and isinstance(args[0], int) and args[0] > 0 and threading.current_thread().name == "reserve":
            allocating.set()
            release.wait(10)
        return real_bytearray(*args)

    monkeypatch.setattr(block_store, "bytearray", slow_bytearray, raising=False)
    reserving = threading.Thread(target=cache.reserve, args=("m", Slot.session(1)), name="reserve")
    reserving.start()
    assert allocating.wait(10)
    opened_box = []
    opening = threading.Thread(target=lambda: opened_box.append(cache.open(best)))
    opening.start()
    opening.join(0.3)
    assert opening.is_alive(), "the restore waits while the buffer is being reserved"
    release.set()
    reserving.join(10)
    opening.join(10)
    (opened,) = opened_box
    try:
        assert bytes(opened.payload) == bytes(fake_state(tokens))
        assert opened.payload.obj is cache.blocks._scratch
    finally:
        opened.close()


def test_clear_counts_a_chain_only_when_its_record_is_gone(tmp_path):
    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    for session in (1, 2):
        tokens = toks(200, start=1000 * session)
        cache.save("m", Slot.session(session), tokens, fake_state(tokens), COMPAT)
    record = cache.blocks.record_path("m", "session", "2")
    record.unlink()
    record.mkdir()  # a folder where the chain record was: it cannot be unlinked
    fresh = PromptCache(tmp_path / "kv", block_tokens=64)
    assert fresh.clear(kind="session") == 1  # session 1; "2" was counted though it stayed
    assert record.is_dir()


def test_a_restore_from_disk_moves_the_chains_last_used(tmp_path):
    import os
    import time

    cache = PromptCache(tmp_path / "kv", block_tokens=64)
    tokens = toks(200)
    cache.save("m", Slot.session(1), tokens, fake_state(tokens), COMPAT)
    record = cache.blocks.record_path("m", "session", "1")
    long_ago = time.time() - 3600
    os.utime(record, (long_ago, long_ago))
    fresh = PromptCache(tmp_path / "kv", block_tokens=64)
    (entry,) = [e for e in fresh.entries() if e.tier == "disk"]
    assert entry.last_used == pytest.approx(long_ago, abs=1)
    parsed = fresh.blocks._read_record(record)
    assert restored(fresh, tokens + [7]) == (tokens, bytes(fake_state(tokens)))
    (entry,) = [e for e in fresh.entries() if e.tier == "disk"]
    assert entry.last_used > long_ago + 3000  # `cache ls` showed the save time
    assert fresh.blocks._read_record(record) is parsed  # touched, not parsed again
