"""A GGUF file's header as llama.cpp itself reads it: ggml's `gguf_*` C
functions (gguf.h, in the libggml llama-cpp-python ships), bound with ctypes.

Contract:
- `read_header(path)` returns the `Header`: every metadata value except
  arrays of strings (a vocabulary, merges) and numeric arrays longer than
  `MAX_ARRAY`, and every tensor's type, element count and extent. llama.cpp's
  reader stops after the tensor index (`no_alloc`, no ggml context): the cost
  is the size of the metadata, never of the weights, and nothing is mapped.
- A file the reader rejects raises `HeaderError` with llama.cpp's own reason
  (its ERROR log lines, taken from the reading thread's log records, which
  are neither printed nor passed on); so does a header whose tensor data
  would end past the end of the file (a download cut short).
- The getters are called only with the type the header states for a key:
  ggml aborts the process on a mismatch.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

MAX_ARRAY = 4096
"""Longer numeric arrays (token types, scores) are left out; per-layer ones are kept."""
MAX_DIMS = 4
"""GGML_MAX_DIMS: `gguf_get_tensor_ne` returns this many sizes."""

# enum gguf_type
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, Any]] = {
    0: ("u8", ctypes.c_uint8), 1: ("i8", ctypes.c_int8), 2: ("u16", ctypes.c_uint16),
    3: ("i16", ctypes.c_int16), 4: ("u32", ctypes.c_uint32), 5: ("i32", ctypes.c_int32),
    6: ("f32", ctypes.c_float), 7: ("bool", ctypes.c_bool), 10: ("u64", ctypes.c_uint64),
    11: ("i64", ctypes.c_int64), 12: ("f64", ctypes.c_double),
}


class HeaderError(Exception):
    """llama.cpp's GGUF reader rejected the file; the message says why."""


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@dataclass(frozen=True)
class Tensor:
    type: int
    """ggml_type."""
    n_elements: int
    end: int
    """Offset of the byte after its data, from the start of the file."""


@dataclass(frozen=True)
class Header:
    metadata: dict[str, Any]
    tensors: tuple[Tensor, ...]


@functools.cache
def _lib() -> ctypes.CDLL:
    # llama-cpp-python's own handle on libggml: the gguf_* symbols resolve
    # through it into libggml-base, the copy its model loader uses.
    from llama_cpp._ggml import libggml as lib

    ctx, i64, size_t = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
    signatures = {
        "gguf_init_from_file": ([ctypes.c_char_p, _InitParams], ctx),
        "gguf_free": ([ctx], None),
        "gguf_get_data_offset": ([ctx], size_t),
        "gguf_get_n_kv": ([ctx], i64),
        "gguf_get_key": ([ctx, i64], ctypes.c_char_p),
        "gguf_get_kv_type": ([ctx, i64], ctypes.c_int),
        "gguf_get_arr_type": ([ctx, i64], ctypes.c_int),
        "gguf_get_arr_n": ([ctx, i64], size_t),
        "gguf_get_arr_data": ([ctx, i64], ctypes.c_void_p),
        "gguf_get_val_str": ([ctx, i64], ctypes.c_char_p),
        "gguf_get_n_tensors": ([ctx], i64),
        "gguf_get_tensor_type": ([ctx, i64], ctypes.c_int),
        "gguf_get_tensor_ne": ([ctx, i64], ctypes.POINTER(i64)),
        "gguf_get_tensor_offset": ([ctx, i64], size_t),
        "gguf_get_tensor_size": ([ctx, i64], size_t),
        **{f"gguf_get_val_{name}": ([ctx, i64], ctype) for name, ctype in _SCALARS.values()},
    }
    for name, (args, result) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


def _value(lib: ctypes.CDLL, ctx: int, i: int) -> Any:
    kind = lib.gguf_get_kv_type(ctx, i)
    if kind == _STRING:
        return _text(lib.gguf_get_val_str(ctx, i))
    if kind in _SCALARS:
        return getattr(lib, f"gguf_get_val_{_SCALARS[kind][0]}")(ctx, i)
    if kind == _ARRAY:
        item = lib.gguf_get_arr_type(ctx, i)
        n = lib.gguf_get_arr_n(ctx, i)
        if item in _SCALARS and n <= MAX_ARRAY:
            data = ctypes.cast(lib.gguf_get_arr_data(ctx, i), ctypes.POINTER(_SCALARS[item][1]))
            return data[:n]
    return None


def _tensors(lib: ctypes.CDLL, ctx: int) -> tuple[Tensor, ...]:
    start = lib.gguf_get_data_offset(ctx)
    out = []
    for i in range(lib.gguf_get_n_tensors(ctx)):
        ne = lib.gguf_get_tensor_ne(ctx, i)
        count = 1
        for d in range(MAX_DIMS):
            count *= ne[d]
        end = start + lib.gguf_get_tensor_offset(ctx, i) + lib.gguf_get_tensor_size(ctx, i)
        out.append(Tensor(lib.gguf_get_tensor_type(ctx, i), count, end))
    return tuple(out)


class _ThisThread(logging.Filter):
    """Takes this thread's records off the llama.cpp logger (other threads',
    an engine's, go on as before), keeping the errors' text."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.errors: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())
        return False


@contextlib.contextmanager
def _reader_errors() -> Iterator[list[str]]:
    from chatterm.core.engine.local import llama_log

    llama_log.install()
    taken = _ThisThread()
    llama_log.logger.addFilter(taken)
    try:
        yield taken.errors
    finally:
        llama_log.logger.removeFilter(taken)


def read_header(path: Path) -> Header:
    lib = _lib()
    with _reader_errors() as errors:
        ctx = lib.gguf_init_from_file(os.fsencode(path), _InitParams(True, None))
    if not ctx:
        reason = "; ".join(e.split(": ", 1)[-1] for e in errors) or "it is not a GGUF file llama.cpp can read"
        raise HeaderError(f"llama.cpp's reader: {reason}")
    try:
        metadata = {}
        for i in range(lib.gguf_get_n_kv(ctx)):
            value = _value(lib, ctx, i)
            if value is not None:
                metadata[_text(lib.gguf_get_key(ctx, i))] = value
        tensors = _tensors(lib, ctx)
    finally:
        lib.gguf_free(ctx)
    size = os.stat(path).st_size
    end = max((t.end for t in tensors), default=0)
    if end > size:
        raise HeaderError(f"its tensor data needs {end:,} bytes")
    return Header(metadata, tensors)
