"""Fuzzing the block tier: block files and chain records are untrusted bytes.

Whatever a block file or chain record holds, a lookup and open through the
public API gives either a `Miss` with a one-line reason, or a payload whose
CRC-32s pass *and* that is byte for byte the state that was saved; `cache
verify` reports, never raises. And a writer SIGKILLed while it writes blocks
leaves no torn block: every block file on disk passes its sha256.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fuzzing import LONG_FACTOR, PROFILE, fuzz
from hypothesis import given
from hypothesis import strategies as st

from chatterm.core.cache import block_file, state_layout
from chatterm.core.cache.prompt_cache import Miss, PromptCache, Slot

REPO = Path(__file__).resolve().parents[2]
MODEL, SLOT = "m", Slot.session(3)
COMPAT = {"model_sha256": "ab" * 32, "type_k": 1}
TOKENS = list(range(10, 90))


def fake_state(tokens, row: int = 48, width: int = 8) -> bytes:
    """A state in llama.cpp's sequence layout (one cache, two layers, V transposed)."""
    n = len(tokens)
    out = bytearray(struct.pack("<IIII", state_layout.MAGIC, 0, 1, n))
    out += b"".join(struct.pack("<iIi", i, 1, 0) for i in range(n))
    out += struct.pack("<II", 1, 2)
    values = [(t * 7 + i) & 0xFF for i, t in enumerate(tokens)]
    for layer in range(2):
        out += struct.pack("<iQ", 1, row) + b"".join(bytes([(v + layer) & 0xFF]) * row for v in values)
    for layer in range(2):
        out += struct.pack("<iII", 1, 2, width)
        out += b"".join(bytes([(v + j) & 0xFF, layer]) for j in range(width) for v in values)
    return bytes(out)


STATE = fake_state(TOKENS)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, bytes]:
    """A saved chain (two blocks of 64 and 16 tokens): file name -> bytes."""
    folder = tmp_path_factory.mktemp("valid") / "kv"
    cache = PromptCache(folder, block_tokens=64)
    assert cache.save(MODEL, SLOT, TOKENS, STATE, COMPAT) is not None
    root = folder / MODEL
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert len(files) == 3
    return files


def install(folder: Path, files: dict[str, bytes]) -> None:
    root = folder / MODEL
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def load(folder: Path) -> bytes | Miss:
    cache = PromptCache(folder)
    found = cache.lookup(MODEL, COMPAT, TOKENS + [1], expect=[SLOT])
    if not found.candidates:
        return Miss(found.misses[0] if found.misses else "no candidate")
    opened = cache.open(found.candidates[0])
    if isinstance(opened, Miss):
        return opened
    try:
        if opened.verify is not None and not opened.verify():
            return Miss("checksum mismatch")
        return bytes(opened.payload)
    finally:
        opened.close()


def assert_safe(folder: Path) -> None:
    result = load(folder)
    if isinstance(result, Miss):
        assert result.reason.strip() and "\n" not in result.reason and len(result.reason) < 300, result.reason
    else:  # all of the saved state, or the part of it before a damaged block
        assert result == fake_state(TOKENS[: state_layout.parse(result).n_tokens])
    for check in PromptCache(folder).verify_files():
        assert isinstance(check.detail, str) and "\n" not in check.detail


def block_names(files: dict[str, bytes]) -> list[str]:
    return sorted(n for n in files if n.endswith(block_file.BLOCK_SUFFIX))


def record_name(files: dict[str, bytes]) -> str:
    (name,) = [n for n in files if n.endswith(block_file.RECORD_SUFFIX)]
    return name


def test_the_saved_chain_loads(tmp_path, saved):
    install(tmp_path / "kv", saved)
    assert load(tmp_path / "kv") == STATE


@fuzz(120)
@given(which=st.integers(0, 1), data=st.binary(max_size=4096)
       | st.binary(max_size=512).map(lambda b: block_file.BLOCK_MAGIC + b))
def test_random_bytes_in_a_block_file_are_a_miss(tmp_path_factory, saved, which, data):
    folder = tmp_path_factory.mktemp("f") / "kv"
    install(folder, {**saved, block_names(saved)[which]: data})
    assert isinstance(load(folder), Miss)
    assert_safe(folder)


@fuzz(200)
@given(which=st.integers(0, 1), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)),
                                              min_size=1, max_size=4), cut=st.none() | st.integers(0, 10**6))
def test_mutated_block_files_are_misses_or_the_saved_state(tmp_path_factory, saved, which, flips, cut):
    name = block_names(saved)[which]
    data = bytearray(saved[name])
    for at, xor in flips:
        data[at % len(data)] ^= xor
    if cut is not None:
        data = data[: cut % len(data)]
    folder = tmp_path_factory.mktemp("f") / "kv"
    install(folder, {**saved, name: bytes(data)})
    assert_safe(folder)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


@fuzz(200)
@given(key=st.sampled_from(["format", "version", "kind", "key", "compat", "frame", "tokens", "segments", "info"]),
       value=json_values)
def test_chain_records_with_a_field_replaced_are_misses_or_the_saved_state(tmp_path_factory, saved, key, value):
    name = record_name(saved)
    body = json.loads(saved[name])
    body[key] = value
    folder = tmp_path_factory.mktemp("f") / "kv"
    install(folder, {**saved, name: json.dumps(body).encode()})
    assert_safe(folder)


@fuzz(150)
@given(index=st.integers(0, 79), delta=st.integers(-3, 3).filter(bool), seg=st.integers(0, 1),
       used=st.integers(-2, 100))
def test_chain_records_with_other_tokens_or_segments_never_restore_another_state(
        tmp_path_factory, saved, index, delta, seg, used):
    name = record_name(saved)
    body = json.loads(saved[name])
    body["tokens"][index] += delta
    body["segments"][seg][1] = used
    folder = tmp_path_factory.mktemp("f") / "kv"
    install(folder, {**saved, name: json.dumps(body).encode()})
    result = load(folder)
    if not isinstance(result, Miss):  # only the tokens before the change can be restored
        assert result == fake_state(TOKENS[: state_layout.parse(result).n_tokens])
        assert state_layout.parse(result).n_tokens <= index
    assert_safe(folder)


# -- a writer killed at random points ---------------------------------------------------
KILLED_WRITER = """
    import json, struct, sys
    from pathlib import Path
    from chatterm.core.cache import state_layout
    from chatterm.core.cache.prompt_cache import PromptCache, Slot
    COMPAT = json.loads(sys.argv[3])
"""
WRITER_LOOP = """
    cache = PromptCache(Path(sys.argv[1]), block_tokens=64)
    print("ready", flush=True)
    i = int(sys.argv[2])
    while True:  # every save adds new blocks: each its own tokens and bytes
        i += 1
        tokens = [(i * 1000 + t) % 30000 for t in range(40 + i % 300)]
        cache.save("m", Slot.session(i % 5), tokens, fake_state(tokens, row=4096), COMPAT)
"""


def test_a_block_writer_killed_at_random_points_leaves_no_torn_block(tmp_path):
    rounds = 20 * (LONG_FACTOR if PROFILE == "long" else 1)
    rng = random.Random(20261203)
    folder = tmp_path / "kv"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    for n in range(rounds):
        script = textwrap.dedent(KILLED_WRITER) + inspect.getsource(fake_state) + textwrap.dedent(WRITER_LOOP)
        child = subprocess.Popen([sys.executable, "-c", script, str(folder), str(n * 1000), json.dumps(COMPAT)],
                                 stdout=subprocess.PIPE, env=env)
        assert child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.05, 0.4))
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        child.stdout.close()
    reader = PromptCache(folder)
    checks = reader.verify_files()
    blocks = [c for c in checks if c.path.suffix == block_file.BLOCK_SUFFIX]
    assert blocks and all(c.ok for c in checks), [c for c in checks if not c.ok][:3]
    for entry in reader.entries():  # every record restores what its blocks hold, or is a miss
        found = reader.lookup("m", COMPAT, entry.tokens + [1]).candidates
        if found and found[0].entry.slot == entry.slot:
            opened = reader.open(found[0])
            if not isinstance(opened, Miss):
                try:
                    assert opened.verify()
                    n = found[0].shared
                    assert bytes(opened.payload) == fake_state(entry.tokens[:n], row=4096)
                finally:
                    opened.close()
    # Killed writers leave only temp files, never listed, swept by the folder's owner.
    assert not [p for p in (folder / "m" / "blocks").iterdir() if not p.name.endswith((".kvblock", ".tmp"))]
