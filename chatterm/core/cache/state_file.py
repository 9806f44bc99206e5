"""The KV state file format: one KV state of one token sequence per file. This
module alone writes and reads it (`chatterm.core.cache.prompt_cache` keeps its
disk tier in such files).

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
- `write(path, tokens, compat, payload, meta)` writes a file atomically. The
  header is the writer's `meta`, then the format's own fields: `tokens`,
  `n_tokens`, `compat` (what the state depends on besides its tokens),
  `payload_len`, `payload_sha256`, `chunk_bytes`, the CRC-32 of every
  CHUNK_BYTES slice of the payload (`chunk_crc32`) and `created_at`. A writer
  that dies leaves only a temp file named `.NAME.*.tmp`
  (`chatterm.core.system.atomic`); whoever owns the folder sweeps them with
  `atomic.sweep_temp_files`.
- `read_header(fh)` returns the JSON header, or raises ValueError with a
  one-line reason (bad magic, other format version, truncated, not JSON, no
  compat section). `read(fh, file_size)` is that header checked against the
  file: a token list, a payload length and digests, and exactly `payload_len`
  bytes of payload after the header; what fails is `Header.problem`, one line.
- `map_payload(fh, header)` maps the payload without reading it;
  `MappedPayload.verify()` checks its CRC-32s on all cores, which can run while
  llama.cpp copies the payload in (cheaper than sha256 and as good at catching
  corruption). `check_payload(fh, header)` reads the payload and checks the
  sha256 too. Neither digest could stop a deliberate forgery (whoever can
  rewrite the payload can rewrite the header): that is what the 0700 folder
  and 0600 files are for.
- `open_regular(path)` opens a file for reading without blocking on a FIFO
  planted in its place.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Sequence

from chatterm.core.system.atomic import atomic_write_chunks

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


def write(
    path: Path,
    tokens: Sequence[int],
    compat: dict[str, Any],
    payload: Any,
    meta: dict[str, Any] | None = None,
) -> None:
    """Write the state file of `payload` (the KV state of `tokens`) atomically;
    OSError when it cannot be written."""
    view = memoryview(payload).cast("B")
    header = {
        **(meta or {}),
        "n_tokens": len(tokens),
        "tokens": list(tokens),
        "compat": compat,
        "payload_len": view.nbytes,
        "payload_sha256": hashlib.sha256(view).hexdigest(),
        "chunk_bytes": CHUNK_BYTES,
        "chunk_crc32": chunk_crc32s(view),
        "created_at": time.time(),
    }
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    atomic_write_chunks(path, [_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(blob)), blob, view])


def open_regular(path: Path) -> BinaryIO:
    """Open for reading without blocking on a FIFO planted at `path`; ValueError
    when it is not a regular file."""
    fh = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise ValueError("not a regular file")
    return fh


def read_header(fh: BinaryIO) -> dict[str, Any]:
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


@dataclass(frozen=True)
class Header:
    """A state file's header, checked against the file (`read`)."""

    fields: dict[str, Any]
    """The whole JSON header: the writer's meta and the format's own fields."""
    payload_offset: int
    tokens: list[int]
    """The tokens whose state the payload is; [] when the header's are not a list of token ids."""
    problem: str = ""
    """Why the payload cannot be used, in one line; empty when it can."""

    @property
    def compat(self) -> dict[str, Any]:
        return self.fields["compat"]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read(fh: BinaryIO, file_size: int) -> Header:
    """The header of an open state file of `file_size` bytes, checked against it.

    Raises ValueError (one line) when there is no header to read (`read_header`)."""
    fields = read_header(fh)
    offset = fh.tell()
    if "tokens" not in fields:
        return Header(fields, offset, [], "corrupt header")
    tokens, size = fields["tokens"], fields.get("payload_len")
    if (not isinstance(tokens, list) or not all(_is_int(t) for t in tokens)
            or not _is_int(size) or size <= 0 or not isinstance(fields.get("chunk_crc32"), list)):
        return Header(fields, offset, [], "corrupt header (tokens, payload length or digests)")
    problem = ""
    if file_size < offset + size:
        problem = f"payload truncated ({file_size - offset:,} of {size:,} bytes)"
    elif file_size > offset + size:
        problem = "corrupt (trailing bytes after the payload)"
    return Header(fields, offset, tokens, problem)


class MappedPayload:
    """A state file's payload, mapped copy-on-write (`map_payload`)."""

    def __init__(self, mapping: mmap.mmap, header: Header):
        self._mapping = mapping
        offset = header.payload_offset
        self.payload = memoryview(mapping)[offset : offset + header.fields["payload_len"]]
        self._digests = header.fields["chunk_crc32"]

    def verify(self) -> bool:
        """The payload matches the header's CRC-32s."""
        return chunk_crc32s(self.payload) == self._digests

    def close(self) -> None:
        """Release the mapping; every buffer made from `payload` must be gone."""
        self.payload.release()
        self._mapping.close()


def map_payload(fh: BinaryIO, header: Header) -> MappedPayload:
    """The payload of the open file `header` was read from, mapped and not read
    yet (the kernel is told it is needed soon); OSError or ValueError when the
    file cannot be mapped. `header` must have no problem."""
    mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    if hasattr(mapping, "madvise"):
        mapping.madvise(mmap.MADV_WILLNEED)
    return MappedPayload(mapping, header)


def check_payload(fh: BinaryIO, header: Header) -> str | None:
    """Read the whole payload of the open file `header` was read from: None when
    its sha256 and CRC-32s match the header, else which does not."""
    fh.seek(header.payload_offset)
    digest, crcs = hashlib.sha256(), []
    while chunk := fh.read(CHUNK_BYTES):  # the chunks the CRC-32s were taken over
        digest.update(chunk)
        crcs.append(zlib.crc32(chunk))
    if digest.hexdigest() != header.fields.get("payload_sha256"):
        return "payload sha256 mismatch"
    if crcs != header.fields.get("chunk_crc32"):
        return "chunk CRC-32 mismatch"
    return None

