"""Fuzzing the KV state file reader: outside bytes never reach llama.cpp unchecked.

A state file on disk is untrusted: a crash, a half-written copy, another
program or another chatterm version may have put anything there. For every
file below, loading through the public API gives either a `Miss` with a
one-line reason, or a state whose checks (compat, length, per-chunk CRC-32)
all pass *and* whose payload is byte for byte the one that was saved. It
never raises and never hangs (each case has a deadline).

The reader is reached through the two adapter functions at the top
(`write_valid_file`, `load_state`), so the tests follow the state-file API
when it moves: today the prompt cache (`PromptCache.lookup` + `open`).
"""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

import pytest
from fuzzing import fuzz
from hypothesis import given
from hypothesis import strategies as st

from chatterm.core.cache.prompt_cache import Miss, OpenedState, PromptCache, Slot
from chatterm.core.cache.state_file import MAGIC

# -- adapter: the state-file API under test -----------------------------------
MODEL, SLOT = "m", Slot.persona("p")
TOKENS = [1, 2, 3, 4]
COMPAT = {"model_sha256": "ab" * 32, "n_ctx": 8192, "type_k": "f16"}
PAYLOAD = bytes(range(256)) * 3 + b"tail"


class LoadedState:
    """What a turn restores: the opened payload, and the compat section its entry was accepted with."""

    def __init__(self, opened: OpenedState, compat: dict):
        self.payload, self.verify, self.close, self.compat = opened.payload, opened.verify, opened.close, compat


def write_valid_file(folder: Path, payload: bytes = PAYLOAD) -> bytes:
    """Save a good state file through the real writer; return its bytes."""
    cache = PromptCache(folder)
    path = cache.save(MODEL, SLOT, TOKENS, payload, COMPAT, {"state_size": len(payload)})
    assert path is not None, cache.write_error
    return path.read_bytes()


def load_existing(folder: Path) -> LoadedState | Miss:
    """What a turn would get from the file in the slot's place: the best
    candidate opened, or a miss with the first reason."""
    cache = PromptCache(folder)
    found = cache.lookup(MODEL, COMPAT, TOKENS + [0], expect=[SLOT])
    if not found.candidates:
        return Miss(found.misses[0] if found.misses else "no candidate")
    best = found.candidates[0]
    opened = cache.open(best)
    return opened if isinstance(opened, Miss) else LoadedState(opened, best.entry.compat)


def load_state(folder: Path, data: bytes) -> LoadedState | Miss:
    """Put `data` where the slot's state file lives and load it."""
    path = PromptCache(folder).path_for(MODEL, SLOT)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return load_existing(folder)


# -- the property --------------------------------------------------------------
def assert_safe(result: LoadedState | Miss) -> None:
    """A miss says why in one short line; a state that passes every check is the saved one."""
    if isinstance(result, Miss):
        assert isinstance(result.reason, str) and result.reason.strip()
        assert "\n" not in result.reason and len(result.reason) < 300, result.reason
        return
    assert isinstance(result, LoadedState)
    try:
        if result.verify():
            # Key by key: a key the caller does not expect may only be null (read as absent).
            found = result.compat
            assert {k: v for k, v in found.items() if v is not None or k in COMPAT} == COMPAT
            assert bytes(result.payload) == PAYLOAD
    finally:
        result.close()


def split(data: bytes) -> tuple[int, dict, int]:
    """(header length, header, payload offset) of a valid file."""
    header_len = struct.unpack_from("<I", data, 16)[0]
    return header_len, json.loads(data[20 : 20 + header_len]), 20 + header_len


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    return write_valid_file(tmp_path_factory.mktemp("valid"))


@pytest.fixture
def folder(tmp_path) -> Path:
    return tmp_path / "kv"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def test_the_valid_file_loads_and_verifies(folder, valid):
    loaded = load_state(folder, valid)
    assert isinstance(loaded, LoadedState) and loaded.verify()
    assert bytes(loaded.payload) == PAYLOAD
    loaded.close()


@fuzz(150)
@given(data=st.binary(max_size=2048) | st.binary(max_size=512).map(lambda b: MAGIC + b))
def test_random_bytes_are_a_miss(folder, data):
    result = load_state(folder, data)
    assert isinstance(result, Miss)
    assert_safe(result)


@fuzz(150)
@given(version=st.integers(0, 2**32 - 1), header_len=st.integers(0, 2**32 - 1) | st.none())
def test_mutated_preamble(folder, valid, version, header_len):
    real_len = struct.unpack_from("<I", valid, 16)[0]
    data = MAGIC + struct.pack("<II", version, real_len if header_len is None else header_len) + valid[20:]
    result = load_state(folder, data)
    if version != 1 or (header_len is not None and header_len != real_len):
        assert isinstance(result, Miss)
    assert_safe(result)


@fuzz(200)
@given(
    path=st.lists(st.sampled_from(["compat", "payload_len", "chunk_crc32", "model_sha256", "n_ctx",
                                   "tokens", "kind", "key", "type_k", "created_at", "chunk_bytes"]),
                  min_size=1, max_size=2),
    value=json_values,
    delete=st.booleans(),
    fix_length=st.booleans(),
)
def test_mutated_header_fields(folder, valid, path, value, delete, fix_length):
    """Wrong JSON types, missing keys, odd values anywhere in the header."""
    _, header, offset = split(valid)
    target = header
    for key in path[:-1]:
        target = target.get(key) if isinstance(target.get(key), dict) else target
    if delete:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    blob = json.dumps(header).encode()
    length = len(blob) if fix_length else struct.unpack_from("<I", valid, 16)[0]
    data = MAGIC + struct.pack("<II", 1, length) + blob + valid[offset:]
    assert_safe(load_state(folder, data))


def test_a_huge_slot_kind_gives_a_short_reason(folder, valid):
    """Found by the long run: the reason quoted the whole value of a damaged `kind`."""
    _, header, offset = split(valid)
    header["kind"] = [None, -10**6, {"0" * 50: None}, ["\x1f" * 40] * 20]
    blob = json.dumps(header).encode()
    result = load_state(folder, MAGIC + struct.pack("<II", 1, len(blob)) + blob + valid[offset:])
    assert isinstance(result, Miss) and "slot kind" in result.reason
    assert_safe(result)


@fuzz(150)
@given(header=json_values | st.text(max_size=200), tail=st.binary(max_size=64))
def test_any_json_header(folder, header, tail):
    blob = json.dumps(header).encode()
    assert_safe(load_state(folder, MAGIC + struct.pack("<II", 1, len(blob)) + blob + tail))


@fuzz(200)
@given(data=st.data())
def test_mutated_payload_never_verifies(folder, valid, data):
    _, _, offset = split(valid)
    body = bytearray(valid)
    positions = data.draw(st.lists(st.integers(offset, len(valid) - 1), min_size=1, max_size=8, unique=True))
    for pos in positions:
        body[pos] ^= data.draw(st.integers(1, 255))
    result = load_state(folder, bytes(body))
    assert isinstance(result, LoadedState)  # the header is intact: the CRCs must catch it
    try:
        assert not result.verify()
    finally:
        result.close()


@fuzz(200)
@given(data=st.data())
def test_spliced_bytes_anywhere(folder, valid, data):
    """Replace, insert or delete a run of bytes in any region of the file."""
    start = data.draw(st.integers(0, len(valid)))
    end = data.draw(st.integers(start, min(len(valid), start + 64)))
    new = data.draw(st.binary(max_size=64))
    assert_safe(load_state(folder, valid[:start] + new + valid[end:]))


@fuzz(100)
@given(data=st.data())
def test_truncation_at_random_offsets(folder, valid, data):
    cut = data.draw(st.integers(0, len(valid) - 1))
    result = load_state(folder, valid[:cut])
    assert isinstance(result, Miss)
    assert_safe(result)


def test_truncation_at_every_offset_is_a_miss(folder, valid):
    """Every region (magic, version, header length, header, payload), every byte."""
    reasons = set()
    for cut in range(len(valid)):
        result = load_state(folder, valid[:cut])
        assert isinstance(result, Miss), cut
        assert_safe(result)
        reasons.add(result.reason.split(": ", 1)[1].split(" (")[0].strip())
    # The reasons tell the regions apart.
    assert reasons == {"file too short for a header", "header truncated", "payload truncated"}, reasons


# -- regressions found by the fuzzer -------------------------------------------
def test_deeply_nested_header_is_a_miss_not_a_recursion_error(folder):
    blob = b"[" * 200_000 + b"]" * 200_000
    result = load_state(folder, MAGIC + struct.pack("<II", 1, len(blob)) + blob)
    assert isinstance(result, Miss) and "not JSON" in result.reason


def test_huge_header_value_gives_a_short_reason(folder, valid):
    _, header, offset = split(valid)
    header["compat"]["type_k"] = "x" * 1_000_000
    header["compat"]["huge\nkey" * 1000] = list(range(100_000))
    blob = json.dumps(header).encode()
    result = load_state(folder, MAGIC + struct.pack("<II", 1, len(blob)) + blob + valid[offset:])
    assert isinstance(result, Miss)
    assert_safe(result)


def test_boolean_payload_length_is_a_miss(folder, valid):
    _, header, offset = split(valid)
    header["payload_len"] = True  # JSON true is an int to Python
    blob = json.dumps(header).encode()
    result = load_state(folder, MAGIC + struct.pack("<II", 1, len(blob)) + blob + b"x")
    assert isinstance(result, Miss)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_the_file_does_not_block(folder):
    path = PromptCache(folder).path_for(MODEL, SLOT)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    results: list = []
    worker = threading.Thread(target=lambda: results.append(load_existing(folder)), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the reader so the test run can end
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("loading a FIFO blocked")
    assert isinstance(results[0], Miss) and "not a regular file" in results[0].reason
    # `chatterm cache ls` and `cache verify` do not block either
    assert [bool(e.problem) for e in PromptCache(folder).entries()] == [True]
    assert [c.ok for c in PromptCache(folder).verify_files()] == [False]
