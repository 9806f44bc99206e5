"""The token-keyed prompt cache: tiers, longest-prefix lookup, misses with reasons,
budgets, atomic files, verification; and a real state through a real file."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import llama_cpp
import pytest

from chatterm.core.cache import state_file
from chatterm.core.cache.prompt_cache import DISK, RAM, Miss, OpenedState, PromptCache, Slot
from chatterm.core.engine.local import kv_state, llama_log
from chatterm.core.workspace import Workspace

COMPAT = {"model_sha256": "ab" * 32, "llama_cpp_build": "cd" * 32, "type_k": 1}
PERSONA = Slot.persona("shop-support")
SESSION = Slot.session(12)


def payload(seed: int, size: int = 9 << 20) -> bytearray:
    # > 2 chunks of 4 MiB, so the per-chunk digests are exercised.
    return bytearray([seed]) * size


def tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def fresh(cache: PromptCache) -> PromptCache:
    """The same folder as another process would see it: no RAM tier."""
    return PromptCache(cache.folder, cache.disk_budget_bytes, cache.ram_budget_bytes)


def rewrite_header(path, mutate):
    data = path.read_bytes()
    magic, version, hlen = struct.unpack("<12sII", data[:20])
    header = json.loads(data[20 : 20 + hlen])
    mutate(header)
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<12sII", magic, version, len(blob)) + blob + data[20 + hlen :])


def test_longest_shared_prefix_wins_and_ram_is_preferred_on_a_tie(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    cache.put("m", PERSONA, tokens(10), payload(1), COMPAT)
    cache.put("m", SESSION, tokens(50), payload(2), COMPAT)
    cache.flush()
    assert {(e.slot, e.tier) for e in cache.entries()} == {
        (PERSONA, RAM), (SESSION, RAM), (PERSONA, DISK), (SESSION, DISK)}

    long_prompt = tokens(50) + [999, 1000]
    found = cache.lookup("m", COMPAT, long_prompt)
    assert [(c.entry.slot, c.entry.tier, c.shared) for c in found.candidates] == [
        (SESSION, RAM, 50), (SESSION, DISK, 50), (PERSONA, RAM, 10), (PERSONA, DISK, 10)]

    # A new conversation with the persona: both share 10; the smaller entry is cheaper.
    found = cache.lookup("m", COMPAT, tokens(10) + [500, 501])
    best = found.candidates[0]
    assert (best.entry.slot, best.entry.tier, best.shared) == (PERSONA, RAM, 10)

    # The prompt IS the entry: one token is always left to decode.
    assert cache.lookup("m", COMPAT, tokens(50)).candidates[0].shared == 49

    # Another process sees only the disk tier.
    other = fresh(cache).lookup("m", COMPAT, long_prompt)
    assert [(c.entry.tier, c.shared) for c in other.candidates] == [(DISK, 50), (DISK, 10)]
    # Another model's states only where every compat field is the same (next test).
    assert fresh(cache).lookup("other-model", {**COMPAT, "type_k": 8}, long_prompt).candidates == []


def test_another_catalog_entry_for_the_same_file_and_settings_shares_the_states(tmp_path):
    """Two entries for one GGUF (say, another n_ctx) compute the same states:
    one reuses the other's, after its own at the same length, and another
    model's states that do not fit are its own business, not misses."""
    cache = PromptCache(tmp_path / "kv", ram_budget_bytes=0)  # disk only, as a new process sees it
    cache.save("small-ctx", SESSION, tokens(50), payload(2, 1 << 20), COMPAT)
    cache.save("m", PERSONA, tokens(10), payload(1, 1 << 20), COMPAT)
    cache.save("q8-kv", Slot.session(12), tokens(60), payload(3, 1 << 20), {**COMPAT, "type_k": 8})
    prompt = tokens(50) + [999]
    found = cache.lookup("m", COMPAT, prompt, expect=[SESSION])
    assert [(c.entry.model_id, c.entry.slot, c.shared) for c in found.candidates] == [
        ("small-ctx", SESSION, 50), ("m", PERSONA, 10)]
    assert found.misses == []  # neither "no saved state" for session 12 nor q8-kv's compat
    opened = cache.open(found.candidates[0])
    assert isinstance(opened, OpenedState) and bytes(opened.payload[:1]) == b"\x02"
    opened.close()
    # At the same length this model's own state comes first.
    cache.save("m", SESSION, tokens(50), payload(4, 1 << 20), COMPAT)
    first = cache.lookup("m", COMPAT, prompt).candidates[0]
    assert (first.entry.model_id, first.shared) == ("m", 50)


def test_every_miss_has_a_reason(tmp_path):
    cache = PromptCache(tmp_path / "kv", ram_budget_bytes=0)  # disk only
    for slot, seed in ((Slot.session(1), 1), (Slot.session(2), 2), (Slot.session(3), 3),
                       (Slot.session(4), 4), (Slot.session(5), 5), (Slot.session(6), 6)):
        cache.save("m", slot, tokens(20), payload(seed, 1 << 20), COMPAT)
    path = lambda n: cache.path_for("m", Slot.session(n))  # noqa: E731
    data = path(1).read_bytes()
    path(1).write_bytes(data[:-5000])                                  # truncated
    path(2).write_bytes(b"definitely not a state file" * 10)            # corrupt
    rewrite_header(path(3), lambda h: h["compat"].update(model_sha256="0" * 64))  # other model
    rewrite_header(path(4), lambda h: h["compat"].update(llama_cpp_build="f" * 64))  # other build
    rewrite_header(path(5), lambda h: h.update(tokens="nope"))          # corrupt header

    prompt = tokens(10) + [77] * 20  # session 6 holds another version: its history was edited
    found = cache.lookup("m", COMPAT, prompt, expect=[Slot.session(6), Slot.session(7)])
    reasons = "\n".join(found.misses)
    assert "session 1 (disk): payload truncated" in reasons
    assert "session 2 (disk): corrupt" in reasons and "bad magic" in reasons
    assert "session 3 (disk): other model or settings: model sha256 differs" in reasons
    assert "session 4 (disk): other build: llama cpp build differs" in reasons
    assert "session 5 (disk): corrupt header" in reasons
    assert ("session 6 (disk): holds another version of the conversation (an edit, a branch, a fork, "
            "or a reply tokenized again from its text): "
            "shares 10 of its 20 tokens with this prompt") in reasons
    assert "session 7: no saved state (not kept yet, or removed)" in reasons
    # The other version still offers what it shares; the damaged ones offer nothing.
    assert [(c.entry.slot, c.shared) for c in found.candidates] == [(Slot.session(6), 10)]


def test_another_version_in_ram_and_on_disk_is_one_reason(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    cache.put("m", Slot.session(6), tokens(20), payload(6, 1 << 20), COMPAT)  # in RAM, then on disk
    cache.flush()
    found = cache.lookup("m", COMPAT, tokens(10) + [77] * 20, expect=[Slot.session(6)])
    other = [m for m in found.misses if "another version" in m]
    assert other == ["session 6 (ram, disk): holds another version of the conversation (an edit, a branch, "
                     "a fork, or a reply tokenized again from its text): shares 10 of its 20 tokens "
                     "with this prompt"], found.misses


def test_disk_payload_is_checked_and_a_replaced_file_is_a_miss(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    cache.save("m", SESSION, tokens(30), payload(7), COMPAT)
    reader = fresh(cache)
    candidate = reader.lookup("m", COMPAT, tokens(31)).candidates[0]
    opened = reader.open(candidate)
    assert isinstance(opened, OpenedState)
    assert bytes(opened.payload) == bytes(payload(7)) and opened.verify()
    opened.close()

    path = cache.path_for("m", SESSION)
    data = bytearray(path.read_bytes())
    data[-(5 << 20)] ^= 1  # one bit in the middle chunk
    path.write_bytes(bytes(data))
    damaged = reader.open(reader.lookup("m", COMPAT, tokens(31)).candidates[0])
    assert isinstance(damaged, OpenedState) and not damaged.verify()
    damaged.close()
    reader.discard(candidate.entry, "payload checksum mismatch")
    assert not path.exists()

    cache.save("m", SESSION, tokens(30), payload(8), COMPAT)
    stale_candidate = reader.lookup("m", COMPAT, tokens(31)).candidates[0]
    cache.save("m", SESSION, tokens(25, start=100), payload(9), COMPAT)  # replaced meanwhile
    miss = reader.open(stale_candidate)
    assert isinstance(miss, Miss) and "replaced on disk" in miss.reason


def test_a_state_file_header_is_parsed_once_however_often_it_is_restored(tmp_path, monkeypatch):
    cache = PromptCache(tmp_path / "kv")
    cache.save("m", SESSION, tokens(30), payload(7, 1 << 20), COMPAT)
    parses = []
    read = state_file.read
    monkeypatch.setattr(state_file, "read", lambda fh, size: parses.append(1) or read(fh, size))
    reader = fresh(cache)
    for _ in range(3):  # each open also touches the file (LRU): still the parsed version
        opened = reader.open(reader.lookup("m", COMPAT, tokens(31)).candidates[0])
        assert bytes(opened.payload) == bytes(payload(7, 1 << 20)) and opened.verify()
        opened.close()
    assert len(parses) == 1
    cache.save("m", SESSION, tokens(30), payload(8, 1 << 20), COMPAT)  # a new version: parsed again
    parses.clear()
    opened = reader.open(reader.lookup("m", COMPAT, tokens(31)).candidates[0])
    assert bytes(opened.payload) == bytes(payload(8, 1 << 20)) and opened.verify()
    opened.close()
    assert len(parses) == 1


def test_ram_tier_keeps_its_budget_least_recently_used_first(tmp_path):
    cache = PromptCache(tmp_path / "kv", ram_budget_bytes=20 << 20)
    for n in (1, 2, 3):
        cache.put("m", Slot.session(n), tokens(10, start=100 * n), payload(n, 8 << 20), COMPAT, disk=False)
    ram = lambda: sorted(e.slot.key for e in cache.entries() if e.tier == RAM)  # noqa: E731
    assert ram() == ["2", "3"]  # 3 x 8 MiB > 20 MiB: session 1 went
    cache.open(cache.lookup("m", COMPAT, tokens(11, start=200)).candidates[0])  # 2 used now
    cache.put("m", Slot.session(4), tokens(10, start=400), payload(4, 8 << 20), COMPAT, disk=False)
    assert ram() == ["2", "4"]
    assert not (tmp_path / "kv").exists()  # disk=False wrote nothing


def test_disk_tier_keeps_its_budget_and_clear_takes_either_kind(tmp_path):
    cache = PromptCache(tmp_path / "kv", disk_budget_bytes=20 << 20, ram_budget_bytes=0)
    for i, slot in enumerate((Slot.persona("a"), Slot.session(1), Slot.session(2))):
        cache.save("m", slot, tokens(10, start=100 * i), payload(i + 1, 8 << 20), COMPAT)
        os.utime(cache.path_for("m", slot), (time.time() - 100 + i, time.time() - 100 + i))
    assert {e.slot for e in cache.entries()} == {Slot.session(1), Slot.session(2)}
    cache.save("m", Slot.persona("b"), tokens(5), payload(9, 3 << 20), COMPAT)
    cache.save("m", Slot.persona("c"), tokens(5), payload(9, 3 << 20), COMPAT)
    assert cache.clear(kind="session") == 1  # session 1 was evicted by the persona files
    assert {e.slot.kind for e in cache.entries()} == {"persona"}
    assert cache.clear(kind="persona", key="b") == 1
    assert [e.slot for e in cache.entries()] == [Slot.persona("c")]
    assert cache.clear() == 1 and cache.entries() == []


def test_verify_files_checks_the_payload_sha256(tmp_path):
    cache = PromptCache(tmp_path / "kv")
    cache.save("m", PERSONA, tokens(10), payload(1), COMPAT)
    cache.save("m", SESSION, tokens(20), payload(2), COMPAT)
    cache.save("m", Slot.session(13), tokens(20), payload(3), COMPAT)
    assert all(check.ok for check in cache.verify_files())
    path = cache.path_for("m", SESSION)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    short = cache.path_for("m", Slot.session(13))
    short.write_bytes(short.read_bytes()[:-10])
    results = {c.label: c for c in fresh(cache).verify_files()}
    assert results["persona shop-support · m"].ok
    assert results["session 12 · m"].detail == "payload sha256 mismatch"
    assert "truncated" in results["session 13 · m"].detail


def test_unwritable_folder_turns_disk_off_with_a_reason_and_ram_still_works(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = PromptCache(blocker / "kv")
    cache.put("m", SESSION, tokens(10), payload(1, 1 << 20), COMPAT)
    cache.flush()
    assert cache.write_error and str(blocker) in cache.write_error
    assert cache.lookup("m", COMPAT, tokens(11)).candidates[0].entry.tier == RAM


WRITER = """
import sys
from pathlib import Path
from chatterm.core.cache.prompt_cache import PromptCache, Slot
cache = PromptCache(Path(sys.argv[1]))
seed = int(sys.argv[2])
for i in range(12):
    size = (3 + (i % 5)) << 20  # different sizes: a torn file would show
    cache.save("m", Slot.session(1), list(range(1, 11)), bytes([seed]) * size, {"k": 1})
"""


def test_two_processes_saving_one_slot_never_tear_the_file(tmp_path):
    folder = tmp_path / "kv"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(s)]) for s in (7, 9)]
    seen = 0
    while any(w.poll() is None for w in writers):
        reader = PromptCache(folder)
        found = reader.lookup("m", {"k": 1}, list(range(1, 12))).candidates
        if not found:
            continue
        best = found[0]
        opened = reader.open(best)
        if isinstance(opened, Miss):
            assert "replaced on disk" in opened.reason
            continue
        data = bytes(opened.payload)
        assert opened.verify()
        assert data in (bytes([7]) * len(data), bytes([9]) * len(data))
        opened.close()
        seen += 1
    assert all(w.returncode == 0 for w in writers)
    assert seen > 0
    assert not [p for p in (folder / "m").iterdir() if p.name.endswith(".tmp")]


# -- a real state, a real file, a fresh model --------------------------------------------


@pytest.fixture(scope="module")
def model_path():
    llama_log.install()
    return Workspace.load().catalog.get(None).model_path()


def load(model_path) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(model_path), n_ctx=512, verbose=False)


def greedy(llm, prompt, n=8) -> list[int]:
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        out.append(token)
        if len(out) == n:
            break
    return out


def test_a_saved_conversation_restores_in_a_fresh_model_and_continues_identically(tmp_path, model_path):
    writer = load(model_path)
    try:
        compat = kv_state.compat_fields(writer, model_path, "sha-of-the-model", flash_attn=False)
        history = writer.tokenize(b"<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
                                  add_bos=False, special=True)
        kv_state.prefill(writer, history)
        state = kv_state.capture(writer)
        cache = PromptCache(tmp_path / "kv")
        cache.put("smollm2", SESSION, state.tokens, state.payload, compat, {"prefill_ms": 1.0})
        cache.flush()
        prompt = history + writer.tokenize(b"Red, green, blue.<|im_end|>\n<|im_start|>user\nAnd two more?"
                                           b"<|im_end|>\n<|im_start|>assistant\n", add_bos=False, special=True)
        kv_state.clear(writer)
        reference = greedy(writer, prompt)  # no cache at all
    finally:
        writer.close()
    # A real state is stored as blocks plus a chain record, no whole-state file.
    assert not cache.path_for("smollm2", SESSION).exists()
    files = [cache.blocks.record_path("smollm2", SESSION.kind, SESSION.key),
             *(tmp_path / "kv" / "smollm2" / "blocks").iterdir()]
    assert len(files) >= 2
    assert sum(p.stat().st_size for p in files) <= 1.01 * state.nbytes

    reader = load(model_path)  # as a relaunch would see it
    try:
        compat = kv_state.compat_fields(reader, model_path, "sha-of-the-model", flash_attn=False)
        cache = PromptCache(tmp_path / "kv")
        found = cache.lookup("smollm2", compat, prompt, expect=[SESSION])
        assert found.misses == []
        best = found.candidates[0]
        assert best.entry.tier == DISK and best.shared == len(history)
        opened = cache.open(best)
        assert isinstance(opened, OpenedState)
        try:
            assert kv_state.restore(reader, opened.payload, opened.tokens, opened.verify) is None
        finally:
            opened.close()
        assert kv_state.trim(reader, best.shared)
        assert greedy(reader, prompt) == reference

        # A block with one flipped payload byte is rejected and dropped.
        path = files[-1]
        data = bytearray(path.read_bytes())
        data[-100] ^= 0xFF
        path.write_bytes(bytes(data))
        best = cache.lookup("smollm2", compat, prompt).candidates[0]
        opened = cache.open(best)
        try:
            reason = kv_state.restore(reader, opened.payload, opened.tokens, opened.verify)
        finally:
            opened.close()
        assert reason == "payload checksum mismatch" and reader.n_tokens == 0
        cache.discard(best.entry, reason)
        assert cache.lookup("smollm2", compat, prompt).candidates == []
        assert greedy(reader, prompt) == reference  # the context is clean after the rejection
    finally:
        reader.close()
