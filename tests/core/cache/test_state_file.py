"""The KV state file format: header reading, chunk digests, temp-file sweeping.
(Writing, lookup, tiers and budgets are tested in test_prompt_cache.py.)"""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zlib

import pytest

from chatterm.core.cache.state_file import CHUNK_BYTES, FORMAT_VERSION, MAGIC, chunk_crc32s, read_header
from chatterm.core.system.atomic import sweep_temp_files


def state_file(header: dict, payload: bytes = b"x" * 10, magic=MAGIC, version=FORMAT_VERSION) -> bytes:
    blob = json.dumps(header).encode()
    return struct.pack("<12sII", magic, version, len(blob)) + blob + payload


def test_read_header_leaves_the_file_at_the_payload():
    fh = io.BytesIO(state_file({"compat": {"a": 1}, "payload_len": 10}))
    assert read_header(fh) == {"compat": {"a": 1}, "payload_len": 10}
    assert fh.read() == b"x" * 10


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"CHATTERM", "too short"),
        (state_file({"compat": {}}, magic=b"OTHER-MAGIC\0"), "bad magic"),
        (state_file({"compat": {}}, version=FORMAT_VERSION + 1), f"format version {FORMAT_VERSION + 1}"),
        (state_file({"compat": {}})[:25], "header truncated"),
        (struct.pack("<12sII", MAGIC, FORMAT_VERSION, 5) + b"{nope", "not JSON"),
        (state_file({"no": "compat"}), "no compat section"),
    ],
)
def test_bad_headers_are_one_line_reasons(data, reason):
    with pytest.raises(ValueError, match=reason):
        read_header(io.BytesIO(data))


def test_chunk_crc32s_cover_every_chunk():
    payload = bytes(range(256)) * ((2 * CHUNK_BYTES + 1000) // 256)
    view = memoryview(payload)
    expected = [zlib.crc32(payload[i : i + CHUNK_BYTES]) for i in range(0, len(payload), CHUNK_BYTES)]
    assert len(expected) == 3 and chunk_crc32s(view) == expected


def test_sweep_removes_only_old_temp_files(tmp_path):
    folder = tmp_path / "kv" / "m"
    folder.mkdir(parents=True)
    old, fresh, state = folder / ".a.kvstate.1.tmp", folder / ".b.kvstate.2.tmp", folder / "a.kvstate"
    for path in (old, fresh, state):
        path.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    assert sweep_temp_files(tmp_path / "kv", "*/.*.tmp") == 1
    assert not old.exists() and fresh.exists() and state.exists()


def test_the_model_hash_cache_sweeps_what_a_killed_writer_left(tmp_path):
    from chatterm.core.system.file_identity import sha256_of_file

    model, cache_file = tmp_path / "m.gguf", tmp_path / "cache" / "model-hashes.json"
    model.write_bytes(b"weights")
    cache_file.parent.mkdir()
    stale = cache_file.parent / ".model-hashes.json.abc123.tmp"  # a quit during a model load
    stale.write_bytes(b"{")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    other = cache_file.parent / ".other.json.abc123.tmp"  # not this writer's
    other.write_bytes(b"{")
    os.utime(other, (time.time() - 7200, time.time() - 7200))
    assert len(sha256_of_file(model, cache_file)) == 64
    assert not stale.exists() and other.exists() and cache_file.exists()


def test_the_model_hash_is_the_files_sha256_and_follows_a_change(tmp_path):
    import hashlib

    from chatterm.core.system.file_identity import sha256_of_file

    model, cache_file = tmp_path / "m.gguf", tmp_path / "model-hashes.json"
    model.write_bytes(os.urandom(300_000))  # more than one read buffer
    assert sha256_of_file(model, cache_file) == hashlib.sha256(model.read_bytes()).hexdigest()
    assert sha256_of_file(model, cache_file) == hashlib.sha256(model.read_bytes()).hexdigest()  # from the cache
    model.write_bytes(b"other weights")
    os.utime(model, ns=(time.time_ns(), time.time_ns() + 1_000_000))  # a new mtime even on a coarse clock
    assert sha256_of_file(model, cache_file) == hashlib.sha256(b"other weights").hexdigest()
    assert len(json.loads(cache_file.read_text())) == 1  # the stale entry for the path is gone
