"""llama.cpp's sequence-state blob, cut along token ranges and put back together.

`llama_state_seq_get_data` hands out one blob (little-endian) per sequence:

    u32 magic 0xAF143CD8, u32 (a field kept as found)
    then per KV cache (a sliding-window model writes two, the full one first):
        u32 n_stream (1), u32 cell_count N
        N x 12 bytes of cell metadata (i32 pos, u32 n_seq_id = 1, i32 seq_id)
        u32 v_trans, u32 n_layer
        per layer: i32 K type, u64 K row bytes R, N x R bytes (one K row per cell)
        per layer, v_trans 0: i32 V type, u64 V row bytes R, N x R bytes
        per layer, v_trans 1 (flash attention off): i32 V type, u32 element
            bytes E, u32 V width W, then W rows of N x E bytes (V transposed:
            each embedding element's values for every cell)

Contract:
- `parse(blob)` reads that layout into a `Layout`: a `Frame` (the parts that do
  not depend on N: fixed bytes, the places N is written, and per-token regions
  of `rows` x N x `stride` bytes) and N. It raises `LayoutError` (one line) for
  anything else: another magic, several streams, a cell holding several
  sequences, cells whose positions are not 0..N-1 in order (a shifted or
  pruned context), caches holding different cell counts (a sliding-window
  cache smaller than the context), trailing bytes.
- `split(blob, layout, ranges)` returns one piece per token range [a, b) of
  `ranges`: each region's bytes for those tokens, regions in
  blob order, `frame.bytes_per_token` bytes a token. Pieces are independent
  of the blob they were cut from: the first k pieces of two blobs that share
  their first tokens (same model and settings) are equal.
- `join(frame, pieces, counts, takes)` builds, in a new writable buffer, the
  blob of the first `takes[i]` of the `counts[i]` tokens of each piece. join(split(blob)) is the
  blob byte for byte; a joined prefix is exactly what llama.cpp writes for the
  prefix, so it restores like it.
- `Frame.to_json()` / `Frame.from_json()` keep a frame in a JSON record;
  `from_json` raises LayoutError on anything malformed. `Frame.digest` names
  a frame, so pieces of different layouts never mix.
- Nothing here touches llama.cpp: bytes in, bytes out (numpy does the copies).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

MAGIC = 0xAF143CD8
_CELL_BYTES = 12
_U32 = struct.Struct("<I")


class LayoutError(ValueError):
    """A blob (or a stored frame) this module cannot cut into token ranges."""


@dataclass(frozen=True)
class Region:
    """`rows` rows of N x `stride` bytes, row after row."""

    rows: int
    stride: int


COUNT = "count"
"""A u32 holding N."""

Part = bytes | str | Region


@dataclass(frozen=True)
class Frame:
    """The blob's layout apart from N: fixed bytes, COUNT fields and regions, in order."""

    parts: tuple[Part, ...]

    @property
    def bytes_per_token(self) -> int:
        return sum(p.rows * p.stride for p in self.parts if isinstance(p, Region))

    @property
    def fixed_bytes(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else 4 for p in self.parts if not isinstance(p, Region))

    def blob_size(self, n_tokens: int) -> int:
        return self.fixed_bytes + n_tokens * self.bytes_per_token

    def to_json(self) -> list[Any]:
        out: list[Any] = []
        for part in self.parts:
            if isinstance(part, bytes):
                out.append(part.hex())
            elif isinstance(part, Region):
                out.append([part.rows, part.stride])
            else:
                out.append(COUNT)
        return out

    @classmethod
    def from_json(cls, value: Any) -> "Frame":
        if not isinstance(value, list) or not value or len(value) > 1 << 16:
            raise LayoutError("frame is not a list of parts")
        parts: list[Part] = []
        for item in value:
            if item == COUNT:
                parts.append(COUNT)
            elif isinstance(item, str):
                try:
                    parts.append(bytes.fromhex(item))
                except ValueError:
                    raise LayoutError("frame has a fixed part that is not hex") from None
            elif (isinstance(item, list) and len(item) == 2
                  and all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 24 for x in item)):
                parts.append(Region(item[0], item[1]))
            else:
                raise LayoutError("frame has a malformed part")
        frame = cls(tuple(parts))
        if frame.bytes_per_token == 0:
            raise LayoutError("frame has no per-token region")
        return frame

    @cached_property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_json(), separators=(",", ":")).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Layout:
    frame: Frame
    n_tokens: int


class _Reader:
    def __init__(self, blob: memoryview):
        self.blob = blob
        self.pos = 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        size = struct.calcsize(fmt)
        if self.pos + size > self.blob.nbytes:
            raise LayoutError(f"blob ends inside a header at byte {self.pos:,}")
        values = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += size
        return values

    def raw(self, start: int) -> bytes:
        return bytes(self.blob[start : self.pos])

    def skip(self, size: int) -> int:
        start = self.pos
        if size < 0 or self.pos + size > self.blob.nbytes:
            raise LayoutError(f"blob ends inside a region at byte {self.pos:,}")
        self.pos += size
        return start


def _check_cells(blob: memoryview, start: int, n: int) -> None:
    import numpy as np  # here, not at import: every CLI command imports this module
    cells = np.frombuffer(blob, dtype="<i4", count=3 * n, offset=start).reshape(n, 3)
    if n and not (cells[:, 1] == 1).all():
        raise LayoutError("a cell holds more than one sequence")
    if n and not (cells[:, 0] == np.arange(n, dtype=np.int32)).all():
        raise LayoutError("cell positions are not 0..N-1 in order (a shifted or pruned context)")


def parse(blob: Any) -> Layout:
    """The layout of a `llama_state_seq_get_data` blob; LayoutError when it is not one this module knows."""
    view = memoryview(blob).cast("B")
    r = _Reader(view)
    (magic, _) = r.take("<II")
    if magic != MAGIC:
        raise LayoutError(f"unknown state magic {magic:#010x}")
    parts: list[Part] = [r.raw(0)]
    n_tokens: int | None = None
    while r.pos < view.nbytes:
        start = r.pos
        (n_stream,) = r.take("<I")
        if n_stream != 1:
            raise LayoutError(f"{n_stream} KV streams (only one is supported)")
        parts.append(r.raw(start))
        (count,) = r.take("<I")
        if n_tokens is None:
            n_tokens = count
        elif count != n_tokens:
            raise LayoutError(f"KV caches hold {n_tokens:,} and {count:,} cells "
                              "(a sliding window smaller than the context)")
        parts.append(COUNT)
        if count == 0:
            raise LayoutError("empty KV cache")
        cells = r.skip(count * _CELL_BYTES)
        _check_cells(view, cells, count)
        parts.append(Region(1, _CELL_BYTES))
        start = r.pos
        v_trans, n_layer = r.take("<II")
        if v_trans not in (0, 1) or not 0 < n_layer < 1 << 12:
            raise LayoutError(f"unexpected v_trans {v_trans} or layer count {n_layer}")
        for _ in range(n_layer):
            _, row = r.take("<iQ")
            parts.append(r.raw(start))
            r.skip(count * row)
            parts.append(Region(1, row))
            start = r.pos
        for _ in range(n_layer):
            if v_trans:
                _, element, width = r.take("<iII")
                parts.append(r.raw(start))
                r.skip(count * element * width)
                parts.append(Region(width, element))
            else:
                _, row = r.take("<iQ")
                parts.append(r.raw(start))
                r.skip(count * row)
                parts.append(Region(1, row))
            start = r.pos
        if any(isinstance(p, Region) and p.stride == 0 for p in parts):
            raise LayoutError("a zero-width region")
    if n_tokens is None:
        raise LayoutError("no KV cache in the blob")
    frame = Frame(tuple(_merge_fixed(parts)))
    if frame.blob_size(n_tokens) != view.nbytes:
        raise LayoutError("blob size does not match its layout")
    return Layout(frame, n_tokens)


def _merge_fixed(parts: list[Part]) -> list[Part]:
    merged: list[Part] = []
    for part in parts:
        if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
            merged[-1] = merged[-1] + part
        elif not (isinstance(part, bytes) and not part):
            merged.append(part)
    return merged


def _regions(frame: Frame, n_tokens: int) -> list[tuple[int, Region]]:
    """(offset in a blob of n_tokens tokens, region) of every region."""
    out, offset = [], 0
    for part in frame.parts:
        if isinstance(part, Region):
            out.append((offset, part))
            offset += part.rows * part.stride * n_tokens
        else:
            offset += len(part) if isinstance(part, bytes) else 4
    return out


def split(blob: Any, layout: Layout, ranges: Sequence[tuple[int, int]]) -> list[bytearray]:
    """The pieces of the token ranges [a, b) in `ranges` (ascending, non-empty, within 0..N)."""
    import numpy as np  # here, not at import: every CLI command imports this module
    n = layout.n_tokens
    last = 0
    for a, b in ranges:
        if not last <= a < b <= n:
            raise LayoutError(f"range {a}..{b} is not an ascending part of 0..{n:,}")
        last = b
    data = np.frombuffer(memoryview(blob).cast("B"), dtype=np.uint8)
    bpt = layout.frame.bytes_per_token
    pieces = [bytearray((b - a) * bpt) for a, b in ranges]
    outs = [np.frombuffer(p, dtype=np.uint8) for p in pieces]
    cursor = [0] * len(pieces)
    for offset, region in _regions(layout.frame, n):
        rows, stride = region.rows, region.stride
        source = data[offset : offset + rows * stride * n].reshape(rows, n * stride)
        for i, (a, b) in enumerate(ranges):
            size = rows * (b - a) * stride
            outs[i][cursor[i] : cursor[i] + size].reshape(rows, (b - a) * stride)[:] = \
                source[:, a * stride : b * stride]
            cursor[i] += size
    return pieces


def join(frame: Frame, pieces: Sequence[Any], counts: Sequence[int], takes: Sequence[int] | None = None,
         out: Any = None) -> Any:
    """The blob of the pieces' tokens: `pieces[i]` holds `counts[i]` tokens, of
    which the first `takes[i]` (all by default) are used. Written into `out`
    (a writable buffer of exactly the blob's size) when given, else into a new
    bytearray; returns the buffer written."""
    import numpy as np  # here, not at import: every CLI command imports this module

    takes = list(counts) if takes is None else list(takes)
    if not len(pieces) == len(counts) == len(takes):
        raise LayoutError("one token count per piece")
    bpt = frame.bytes_per_token
    views = [np.frombuffer(memoryview(p).cast("B"), dtype=np.uint8) for p in pieces]
    for view, count, take in zip(views, counts, takes, strict=True):
        if count <= 0 or not 0 < take <= count or view.nbytes != count * bpt:
            raise LayoutError(f"a piece of {view.nbytes:,} bytes does not hold {take:,} of {count:,} tokens")
    n = sum(takes)
    if out is None:
        blob = bytearray(frame.blob_size(n))
    else:
        blob = memoryview(out).cast("B")
        if blob.readonly or blob.nbytes != frame.blob_size(n):
            raise LayoutError("the output buffer is not a writable buffer of the blob's size")
    target_bytes = np.frombuffer(blob, dtype=np.uint8)
    offset = 0
    for part in frame.parts:
        if isinstance(part, bytes):
            blob[offset : offset + len(part)] = part
            offset += len(part)
        elif part == COUNT:
            _U32.pack_into(blob, offset, n)
            offset += 4
        else:
            offset += part.rows * part.stride * n
    cursor = [0] * len(views)
    for offset, region in _regions(frame, n):
        rows, stride = region.rows, region.stride
        target = target_bytes[offset : offset + rows * stride * n].reshape(rows, n * stride)
        at = 0
        for i, (view, count, take) in enumerate(zip(views, counts, takes, strict=True)):
            size = rows * count * stride
            source = view[cursor[i] : cursor[i] + size].reshape(rows, count * stride)
            target[:, at * stride : (at + take) * stride] = source[:, : take * stride]
            cursor[i] += size
            at += take
    return out if out is not None else blob
