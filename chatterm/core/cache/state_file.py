"""The KV state file format (used by `chatterm.core.cache.prompt_cache`).

File layout (little-endian):

    b"CHATTERM-KV\\0"  12-byte magic
    u32               format version (FORMAT_VERSION)
    u32               header length H
    H bytes           UTF-8 JSON header
    payload           the raw `llama_state_seq_get_data` blob of sequence 0

Contract:
- No pickle anywhere: the header is JSON, the payload raw bytes handed to
  llama.cpp only after every check passed. File bytes are the payload plus a
  header of a few KB (the tokens as JSON): <= 1.01x the state for any state
  worth caching.
- The header carries `compat` (what the state depends on besides its tokens),
  `payload_len`, `payload_sha256` and the CRC-32 of every CHUNK_BYTES slice of
  the payload (`chunk_crc32`). The CRC-32s are checked on all cores while
  llama.cpp copies a payload in: twice as fast as sha256 here (12.7 vs 22.5 ms
  for 54 MB on 2 cores) and as good at catching corruption; `chatterm cache
  verify` checks the sha256 too. Neither digest could stop a deliberate forgery
  (whoever can rewrite the payload can rewrite the header): that is what the
  0700 folder and 0600 files are for.
- `read_header` raises ValueError with a one-line reason (bad magic, other
  format version, truncated, not JSON, no compat section).
- Writers leave only temp files named `.NAME.*.tmp` behind when they die
  (`chatterm.core.system.atomic`); the prompt cache sweeps its folders with
  `atomic.sweep_temp_files`.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MAGIC = b"CHATTERM-KV\0"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<12sII")
SUFFIX = ".kvstate"
CHUNK_BYTES = 4 << 20


def chunk_crc32s(payload: memoryview) -> list[int]:
    """CRC-32 of each CHUNK_BYTES slice, computed on all cores (zlib releases the GIL)."""
    chunks = [payload[i : i + CHUNK_BYTES] for i in range(0, payload.nbytes, CHUNK_BYTES)]
    with ThreadPoolExecutor(max_workers=max(os.cpu_count() or 1, 1)) as pool:
        return list(pool.map(zlib.crc32, chunks))


def read_header(fh) -> dict[str, Any]:
    """The JSON header of an open state file, leaving `fh` at the payload."""
    raw = fh.read(_PREAMBLE.size)
    if len(raw) < _PREAMBLE.size:
        raise ValueError("file too short for a header (truncated)")
    magic, version, header_len = _PREAMBLE.unpack(raw)
    if magic != MAGIC:
        raise ValueError("not a chatterm KV state file (bad magic)")
    if version != FORMAT_VERSION:
        raise ValueError(f"format version {version}, expected {FORMAT_VERSION}")
    if header_len > 64 << 20:
        raise ValueError("corrupt header length")
    blob = fh.read(header_len)
    if len(blob) != header_len:
        raise ValueError("header truncated")
    try:
        header = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # RecursionError: "[[[[..."
        raise ValueError("corrupt header (not JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("compat"), dict):
        raise ValueError("corrupt header (no compat section)")
    return header


def read_ms_of(path: Path) -> float:
    """Time to read a whole file into memory (what a plain load would cost)."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        buffer = bytearray(os.fstat(fh.fileno()).st_size)
        fh.readinto(buffer)
    return (time.perf_counter() - t0) * 1000.0
