"""KVStateCache file handling on real files: atomic writes, concurrent writers, LRU."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from chatterm.core.kv_cache import KVStateCache, LoadedState, Miss

COMPAT = {"model_sha256": "ab" * 32, "prefix_tokens": [1, 2, 3]}


def payload_of(seed: int, size: int = 9 << 20) -> bytes:
    # > 2 chunks, so the per-chunk digests are exercised.
    return bytes([seed]) * size


def save(cache, persona, seed=1, size=9 << 20):
    return cache.save("m", persona, COMPAT, {"n_prefix_tokens": 3, "state_size": size}, payload_of(seed, size))


def test_round_trip_and_verification(tmp_path):
    cache = KVStateCache(tmp_path / "kv")
    path = save(cache, "p")
    loaded = cache.load("m", "p", COMPAT)
    assert isinstance(loaded, LoadedState)
    assert bytes(loaded.payload) == payload_of(1)
    assert loaded.verify()
    loaded.close()

    data = bytearray(path.read_bytes())
    data[-(5 << 20)] ^= 1  # one bit in the middle chunk
    path.write_bytes(bytes(data))
    damaged = cache.load("m", "p", COMPAT)
    assert isinstance(damaged, LoadedState) and not damaged.verify()
    damaged.close()


def test_compat_mismatch_is_a_miss_naming_the_key(tmp_path):
    cache = KVStateCache(tmp_path / "kv")
    save(cache, "p")
    miss = cache.load("m", "p", {**COMPAT, "prefix_tokens": [1, 2, 4]})
    assert isinstance(miss, Miss) and "prefix tokens differ" in miss.reason
    assert isinstance(cache.load("m", "other", COMPAT), Miss)


WRITER = """
import sys
from chatterm.core.kv_cache import KVStateCache
cache = KVStateCache(__import__('pathlib').Path(sys.argv[1]))
seed = int(sys.argv[2])
compat = {"model_sha256": "ab" * 32, "prefix_tokens": [1, 2, 3]}
for i in range(15):
    size = (3 + (i % 5)) << 20  # different sizes: a torn file would show
    cache.save("m", "p", compat, {"n_prefix_tokens": 3, "state_size": size}, bytes([seed]) * size)
"""


def test_two_processes_writing_one_persona_never_tear_the_file(tmp_path):
    folder = tmp_path / "kv"
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(seed)]) for seed in (7, 9)
    ]
    cache = KVStateCache(folder)
    seen = 0
    while any(w.poll() is None for w in writers):
        loaded = cache.load("m", "p", COMPAT)
        if isinstance(loaded, Miss):
            assert loaded.reason == "no state file yet"
            continue
        data = bytes(loaded.payload)
        assert loaded.verify()
        assert data in (bytes([7]) * len(data), bytes([9]) * len(data))
        loaded.close()
        seen += 1
    assert all(w.returncode == 0 for w in writers)
    assert seen > 0
    assert not [p for p in (folder / "m").iterdir() if p.name.endswith(".tmp")]


def test_lru_eviction_keeps_the_budget(tmp_path):
    cache = KVStateCache(tmp_path / "kv", budget_bytes=20 << 20)
    for i, persona in enumerate(("a", "b", "c")):
        save(cache, persona, seed=i + 1, size=8 << 20)
        os.utime(cache.path_for("m", persona), (time.time() - 100 + i, time.time() - 100 + i))
    # a (oldest) went when c arrived: 3 x 8 MiB > 20 MiB
    assert {e.persona_id for e in cache.entries()} == {"b", "c"}
    cache.load("m", "b", COMPAT).close()  # b is now the most recently used
    save(cache, "d", seed=4, size=8 << 20)
    assert {e.persona_id for e in cache.entries()} == {"b", "d"}
    assert cache.clear("b") == 1
    assert [e.persona_id for e in cache.entries()] == ["d"]


def test_unwritable_folder_disables_saving_with_a_reason(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = KVStateCache(blocker / "kv")
    assert save(cache, "p") is None
    assert cache.write_error and str(blocker) in cache.write_error
