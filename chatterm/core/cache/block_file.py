"""The files of the block tier: KV blocks and the chain records naming them.

A KV block is the piece (`state_layout.split`) of one token range [start,
start + n) of a KV state, computed after the tokens before it. Its key is a
hash chain: `chain_key(prev, tokens)`, where `prev` is the key of everything
before it (`root_key(compat, frame)` for the first block), so equal keys mean
the same tokens after the same tokens, under the same model and settings.

Block file (`<key>.kvblock`, little-endian):

    b"CHATTERM-KB\\0"  12-byte magic
    u32               format version (BLOCK_VERSION)
    u32               header length H
    H bytes           UTF-8 JSON header: key, prev, start, tokens, frame
                      (`Frame.digest`), payload_len, crc32, sha256, created_at
    payload           the piece

Chain record (`<kind>-<key>.kvchain`): one JSON object, `format` =
"chatterm-kv-chain", `version`, `kind`, `key`, `model_id`, `compat`, `frame`
(`Frame.to_json`), `tokens`, `segments` ([block key, tokens used] in order: a
state may use only the first tokens of a block it shares with another state)
and the writer's `info`.

Contract:
- `write_block` and `write_record` write atomically
  (`chatterm.core.system.atomic`): a block or record is on disk whole or not
  at all; OSError when it cannot be written.
- `read_block(path, key)` returns the block's `BlockHeader` and its payload
  mapped (not read yet), or raises BlockError with a one-line reason: not a
  regular file, bad magic, another version, truncated, trailing bytes, a
  header that is not JSON or not this block's (the key in it or the one its
  prev and tokens hash to differ from its name: a foreign or renamed file).
  `BlockHeader.crc_ok(payload)` checks the CRC-32 (releases the GIL);
  `check_block(path, key)` reads the payload and checks its sha256 too.
- `read_record(path)` returns the `Record`, or raises BlockError (one line).
  Its tokens are checked against the blocks at restore time: each block's
  `prev` must be the key of the record's tokens before it, and its tokens must
  start with the record's.
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
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import orjson

from chatterm.core.system.atomic import atomic_write_bytes, atomic_write_chunks

BLOCK_MAGIC = b"CHATTERM-KB\0"
BLOCK_VERSION = 1
BLOCK_SUFFIX = ".kvblock"
RECORD_SUFFIX = ".kvchain"
RECORD_FORMAT = "chatterm-kv-chain"
RECORD_VERSION = 1
_PREAMBLE = struct.Struct("<12sII")
_MAX_HEADER = 16 << 20
_MAX_RECORD = 64 << 20


class BlockError(ValueError):
    """A block or chain record that cannot be used, with its one-line reason."""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode("utf-8")


def root_key(compat: dict[str, Any], frame_digest: str) -> str:
    """The key of the empty prefix under `compat` and a state layout."""
    return hashlib.sha256(b"chatterm-kv-root\0" + _canonical(compat) + frame_digest.encode()).hexdigest()[:32]


def chain_key(prev: str, tokens: Sequence[int]) -> str:
    """The key of `tokens` following the prefix whose key is `prev`."""
    return hashlib.sha256(prev.encode() + array("q", tokens).tobytes()).hexdigest()[:32]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _token_list(value: Any) -> bool:
    """A list of int32s (no bools): checked in C, since every record of every
    model is read on a process's first lookup, with thousands of tokens each
    (a Python loop over them was 80 % of that lookup)."""
    if not isinstance(value, list) or not set(map(type, value)) <= {int}:
        return False
    try:
        array("i", value)  # C int: OverflowError outside int32
    except OverflowError:
        return False
    return True


@dataclass(frozen=True)
class BlockHeader:
    key: str
    prev: str
    start: int
    tokens: list[int]
    frame: str
    payload_len: int
    crc32: int
    sha256: str

    def crc_ok(self, payload: Any) -> bool:
        return zlib.crc32(payload) == self.crc32


def write_block(path: Path, key: str, prev: str, start: int, tokens: Sequence[int], frame: str,
                payload: Any) -> int:
    """Write one block file atomically; its size in bytes."""
    view = memoryview(payload).cast("B")
    header = _canonical({
        "key": key, "prev": prev, "start": start, "tokens": list(tokens), "frame": frame,
        "payload_len": view.nbytes, "crc32": zlib.crc32(view),
        "sha256": hashlib.sha256(view).hexdigest(), "created_at": time.time(),
    })
    atomic_write_chunks(path, [_PREAMBLE.pack(BLOCK_MAGIC, BLOCK_VERSION, len(header)), header, view])
    return _PREAMBLE.size + len(header) + view.nbytes


def _open_regular(path: Path):
    fh = open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb")
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise BlockError("not a regular file")
    return fh


def _parse_header(fh, size: int, key: str) -> tuple[BlockHeader, int]:
    raw = fh.read(_PREAMBLE.size)
    if len(raw) < _PREAMBLE.size:
        raise BlockError("truncated (no header)")
    magic, version, length = _PREAMBLE.unpack(raw)
    if magic != BLOCK_MAGIC:
        raise BlockError("not a chatterm KV block (bad magic)")
    if version != BLOCK_VERSION:
        raise BlockError(f"block format version {version}, expected {BLOCK_VERSION}")
    if length > _MAX_HEADER or _PREAMBLE.size + length > size:
        raise BlockError("truncated or corrupt header length")
    try:
        fields = json.loads(fh.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BlockError("corrupt header (not JSON)") from None
    if not isinstance(fields, dict):
        raise BlockError("corrupt header (not an object)")
    try:
        header = BlockHeader(
            str(fields["key"]), str(fields["prev"]), fields["start"], fields["tokens"], str(fields["frame"]),
            fields["payload_len"], fields["crc32"], str(fields["sha256"]))
    except KeyError as exc:
        raise BlockError(f"corrupt header (no {exc.args[0]!r})") from None
    if not (_is_int(header.start) and header.start >= 0 and _token_list(header.tokens) and header.tokens
            and _is_int(header.payload_len) and header.payload_len > 0 and _is_int(header.crc32)):
        raise BlockError("corrupt header (start, tokens, length or digest)")
    if header.key != key or chain_key(header.prev, header.tokens) != key:
        raise BlockError("foreign block (its key, prev and tokens do not give its file name)")
    offset = _PREAMBLE.size + length
    if size < offset + header.payload_len:
        raise BlockError(f"payload truncated ({size - offset:,} of {header.payload_len:,} bytes)")
    if size > offset + header.payload_len:
        raise BlockError("corrupt (trailing bytes after the payload)")
    return header, offset


class MappedBlock:
    """A block file's payload, mapped copy-on-write."""

    def __init__(self, header: BlockHeader, mapping: mmap.mmap, offset: int):
        self.header = header
        self._mapping = mapping
        self.payload = memoryview(mapping)[offset : offset + header.payload_len]

    def close(self) -> None:
        self.payload.release()
        self._mapping.close()


def read_block(path: Path, key: str) -> MappedBlock:
    """The block file `path` holding block `key`, checked and mapped; BlockError (or FileNotFoundError)."""
    try:
        fh = _open_regular(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise BlockError(f"unreadable: {exc.strerror or exc}") from None
    with fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            header, offset = _parse_header(fh, size, key)
            mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as exc:
            raise BlockError(f"unreadable: {exc.strerror or exc}") from None
    if hasattr(mapping, "madvise"):
        mapping.madvise(mmap.MADV_WILLNEED)
    return MappedBlock(header, mapping, offset)


def check_block(path: Path, key: str) -> tuple[BlockHeader, str | None]:
    """Read a whole block: its header and None when its sha256 and CRC-32 match, else which does not.
    BlockError (or FileNotFoundError) when it has no usable header."""
    block = read_block(path, key)
    try:
        payload = block.payload
        if hashlib.sha256(payload).hexdigest() != block.header.sha256:
            return block.header, "payload sha256 mismatch"
        if not block.header.crc_ok(payload):
            return block.header, "payload CRC-32 mismatch"
        return block.header, None
    finally:
        block.close()


@dataclass(frozen=True)
class Record:
    kind: str
    key: str
    model_id: str
    compat: dict[str, Any]
    frame: list[Any]
    tokens: list[int]
    segments: list[tuple[str, int]]
    info: dict[str, Any]


def write_record(path: Path, record: Record) -> None:
    body = {
        "format": RECORD_FORMAT, "version": RECORD_VERSION, "kind": record.kind, "key": record.key,
        "model_id": record.model_id, "compat": record.compat, "frame": record.frame,
        "tokens": record.tokens, "segments": [list(s) for s in record.segments], "info": record.info,
        "created_at": time.time(),
    }
    atomic_write_bytes(path, json.dumps(body, separators=(",", ":")).encode("utf-8"))


def read_record(path: Path) -> Record:
    """A chain record, checked for shape; BlockError (one line) or OSError."""
    fh = _open_regular(path)
    with fh:
        data = fh.read(_MAX_RECORD + 1)
    if len(data) > _MAX_RECORD:
        raise BlockError("chain record too large")
    try:
        # orjson: a lookup parses every record of every model folder once per
        # process (`PromptCache.lookup` shares states across catalog entries),
        # and a record holds its thousands of tokens.
        body = orjson.loads(data)
    except orjson.JSONDecodeError:  # not UTF-8, not JSON, nested too deep
        raise BlockError("corrupt chain record (not JSON)") from None
    if not isinstance(body, dict) or body.get("format") != RECORD_FORMAT:
        raise BlockError("not a chatterm chain record")
    if body.get("version") != RECORD_VERSION:
        raise BlockError(f"chain record version {_short(body.get('version'))}, expected {RECORD_VERSION}")
    tokens, segments = body.get("tokens"), body.get("segments")
    if not _token_list(tokens) or not isinstance(segments, list) or not segments:
        raise BlockError("corrupt chain record (tokens or segments)")
    parsed: list[tuple[str, int]] = []
    for seg in segments:
        if not (isinstance(seg, list) and len(seg) == 2 and isinstance(seg[0], str) and len(seg[0]) == 32
                and all(c in "0123456789abcdef" for c in seg[0]) and _is_int(seg[1]) and seg[1] > 0):
            raise BlockError("corrupt chain record (a segment)")
        parsed.append((seg[0], seg[1]))
    if sum(used for _, used in parsed) != len(tokens):
        raise BlockError("corrupt chain record (segments do not cover its tokens)")
    compat, info = body.get("compat"), body.get("info", {})
    if not isinstance(compat, dict) or not isinstance(info, dict) or not isinstance(body.get("frame"), list):
        raise BlockError("corrupt chain record (compat, frame or info)")
    if not isinstance(body.get("kind"), str) or not isinstance(body.get("key"), str):
        raise BlockError("corrupt chain record (slot)")
    return Record(body["kind"], body["key"], str(body.get("model_id", "")), compat, body["frame"],
                  tokens, parsed, info)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:23] + "…"
