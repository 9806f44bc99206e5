"""KV states in llama.cpp's sequence layout, built without a model.

`fake_state(tokens)`: one cache, `layers` layers, V transposed, each cell's
bytes a function of its token and position, so a state cut into blocks and
joined again can be compared byte for byte. tests/core/cache/test_state_layout.py
checks the layout itself on real models."""

from __future__ import annotations

import struct

from chatterm.core.cache import state_layout

ROW = 1024
BPT = 12 + 2 * ROW + 2 * 64 * 2
"""Bytes per token of `fake_state` with its defaults."""


def fake_state(tokens, layers: int = 2, row: int = ROW, width: int = 64) -> bytearray:
    """A state in llama.cpp's layout whose bytes for a cell depend on its token and position."""
    n = len(tokens)
    out = bytearray(struct.pack("<IIII", state_layout.MAGIC, 0, 1, n))
    out += b"".join(struct.pack("<iIi", i, 1, 0) for i in range(n))
    out += struct.pack("<II", 1, layers)
    values = [(t * 7 + i * 13) & 0xFF for i, t in enumerate(tokens)]
    for layer in range(layers):
        out += struct.pack("<iQ", 1, row) + b"".join(bytes([(v + layer) & 0xFF]) * row for v in values)
    for layer in range(layers):
        out += struct.pack("<iII", 1, 2, width)
        out += b"".join(bytes([(v + j) & 0xFF, layer]) for j in range(width) for v in values)
    return out
