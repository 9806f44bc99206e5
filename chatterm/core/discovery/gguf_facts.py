"""What a GGUF's header says about a model, read by llama.cpp's own GGUF
reader (`gguf_header`).

Contract:
- `read_facts(files)` reads the header of a GGUF, or of every shard of a split
  GGUF in order (shard 1 holds the metadata; each holds some tensors), and
  returns its `GgufFacts`. Only the header and the tensor index are read:
  the tensor data is never read, mapped or written.
- A file that is not a usable chat model raises `Unusable` with one line
  saying why: no GGUF magic, a header or tensor data that ends early (a
  truncated download), a split whose shards disagree, a projector (mmproj)
  file.
- `kv_bytes_per_token` is the f16 KV cache one token costs: 2 bytes x the
  sum over layers of KV heads x (key length + value length), K and V; None
  when the header lacks one of those numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from chatterm.core.discovery.gguf_header import Header, HeaderError, read_header

GGUF_MAGIC = b"GGUF"
F16_BYTES = 2


class Unusable(Exception):
    """A file that is not a usable chat model; the message says why. `lasting`:
    the file's content is the reason, which holds until the file changes (a
    file that could not be read, say for its permissions, may be readable next time)."""

    def __init__(self, reason: str, lasting: bool = True):
        super().__init__(reason)
        self.lasting = lasting


@dataclass(frozen=True)
class GgufFacts:
    architecture: str
    parameters: int
    """Elements of every tensor, all shards together."""
    quantization: str
    """llama.cpp's file type name (Q4_K_M, Q8_0, F16...)."""
    file_size: int
    """Bytes on disk, all shards together."""
    context_length: int | None
    """The context the model was trained for."""
    has_chat_template: bool
    kv_bytes_per_token: int | None
    name: str = ""
    """general.name, as the file states it (untrusted text)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "GgufFacts":
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls)})


MAX_LAYERS = 10_000
"""More blocks than any model has (the largest have a few hundred)."""
MAX_HEADS = 1 << 16
MAX_HEAD_DIM = 1 << 16
"""Far past any model's KV heads (at most a few hundred) and head size (at most
a few thousand); beyond them a figure is unknown, and stays within 64 bits."""


def _kv_bytes_per_token(meta: dict[str, Any], arch: str) -> int | None:
    layers = meta.get(f"{arch}.block_count")
    heads = meta.get(f"{arch}.attention.head_count")
    kv_heads = meta.get(f"{arch}.attention.head_count_kv")
    if kv_heads is None:
        kv_heads = heads
    embedding = meta.get(f"{arch}.embedding_length")
    head_dim = None
    if isinstance(heads, int) and heads and isinstance(embedding, int):
        head_dim = embedding // heads
    key_len = meta.get(f"{arch}.attention.key_length") or head_dim
    value_len = meta.get(f"{arch}.attention.value_length") or head_dim
    # A header's numbers are the file's word: a count past any real model's (a
    # crafted 227-byte file said 4 billion layers) or a negative length is unknown.
    if not (isinstance(layers, int) and 0 < layers <= MAX_LAYERS and _sane(key_len) and _sane(value_len)):
        return None
    # Some architectures give KV heads per layer (an array), most one number.
    if isinstance(kv_heads, list):
        if len(kv_heads) < layers or not all(isinstance(h, int) and 0 <= h <= MAX_HEADS for h in kv_heads[:layers]):
            return None
        heads_total = sum(kv_heads[:layers])
    elif isinstance(kv_heads, int) and 0 <= kv_heads <= MAX_HEADS:
        heads_total = kv_heads * layers
    else:
        return None
    return F16_BYTES * heads_total * (key_len + value_len)


def _sane(length: object) -> bool:
    """A head's key or value length a model can have (positive, at most MAX_HEAD_DIM)."""
    return isinstance(length, int) and 0 < length <= MAX_HEAD_DIM


def _quantization(header: Header) -> str:
    import gguf

    file_type = header.metadata.get("general.file_type")
    try:
        return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        pass
    # No (or an unknown) file type: name the tensor type holding most weights.
    counts: dict[int, int] = {}
    for tensor in header.tensors:
        counts[tensor.type] = counts.get(tensor.type, 0) + tensor.n_elements
    if not counts:
        return "unknown"
    most = max(counts, key=counts.__getitem__)
    try:
        return gguf.GGMLQuantizationType(most).name
    except ValueError:
        return f"ggml type {most}"


def _open(path: Path) -> tuple[Header, int]:
    """The header of one file, or `Unusable` saying what is wrong with it."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise Unusable(f"cannot read {path.name}: {exc.strerror or exc}", lasting=False) from None
    if magic != GGUF_MAGIC:
        raise Unusable(f"{path.name} is not a GGUF file (it does not start with the GGUF magic)")
    try:
        return read_header(path), size
    except HeaderError as exc:
        raise Unusable(f"{path.name} is truncated or damaged ({size:,} bytes; {exc})") from None
    except OSError as exc:
        raise Unusable(f"cannot read {path.name}: {exc.strerror or exc}", lasting=False) from None


def read_facts(files: Sequence[Path]) -> GgufFacts:
    if not files:
        raise Unusable("no GGUF file")
    first, first_size = _open(files[0])
    meta = first.metadata
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise Unusable(f"{files[0].name} names no architecture (general.architecture)")
    if arch == "clip" or meta.get("general.type") == "mmproj":
        raise Unusable(f"{files[0].name} is a projector (mmproj) file, not a chat model")
    split_count = meta.get("split.count")
    if len(files) > 1 and split_count != len(files):
        said = f"says it is split in {split_count} shards" if isinstance(split_count, int) else "names no split"
        raise Unusable(f"{files[0].name} {said}; {len(files)} were found")
    if len(files) == 1 and isinstance(split_count, int) and split_count > 1:
        raise Unusable(f"{files[0].name} is shard 1 of {split_count}; the others were not found beside it")
    parameters = sum(t.n_elements for t in first.tensors)
    size = first_size
    for shard in files[1:]:
        header, shard_size = _open(shard)
        parameters += sum(t.n_elements for t in header.tensors)
        size += shard_size
    if not parameters:  # llama.cpp's ggml-vocab-*.gguf: a tokenizer for its tests
        raise Unusable(f"{files[0].name} holds no weights (a vocabulary-only GGUF, not a model)")
    context = meta.get(f"{arch}.context_length")
    name = meta.get("general.name")
    return GgufFacts(
        architecture=arch,
        parameters=parameters,
        quantization=_quantization(first),
        file_size=size,
        context_length=int(context) if isinstance(context, int) else None,
        has_chat_template=bool(meta.get("tokenizer.chat_template")),
        kv_bytes_per_token=_kv_bytes_per_token(meta, arch),
        name=name if isinstance(name, str) else "",
    )
