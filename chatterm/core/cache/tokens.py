"""Token sequences: the one helper every prefix-reuse decision is made with.

A leaf module (no llama.cpp import), so the prompt cache and the CLI commands
that never load a model do not pay for importing llama-cpp-python.
"""

from __future__ import annotations

from typing import Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
