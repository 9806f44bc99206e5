"""Persona KV state files: the prefilled system prompt of a persona, on disk.

File layout (little-endian):

    b"CHATTERM-KV\\0"  12-byte magic
    u32               format version (FORMAT_VERSION)
    u32               header length H
    H bytes           UTF-8 JSON header
    payload           the raw `llama_state_seq_get_data` blob of sequence 0

Contract:
- No pickle anywhere: the header is JSON, the payload raw bytes handed to
  llama.cpp only after every check passed.
- `load()` maps the file and returns its payload only when the header's
  `compat` equals the caller's expected `compat` key by key (model sha256,
  llama.cpp build, KV types, flash attention, rope parameters, template hash,
  persona hash, prefix tokens ...) and the payload length matches. Anything
  else is a `Miss` with a one-line reason; the caller rebuilds and overwrites
  the file. The payload's integrity is checked by `LoadedState.verify()`: the
  CRC-32 of every 4 MiB chunk, listed in the header beside the whole payload's
  sha256, computed on all cores while llama.cpp copies the payload in; the
  caller discards the restored state when it fails. CRC-32 rather than sha256
  at restore time because it is twice as fast here (12.7 vs 22.5 ms for 54 MB
  on 2 cores) and catches corruption as well; neither digest could stop a
  deliberate forgery (whoever can rewrite the payload can rewrite the header),
  which is what the 0700 folder is for.
- The payload is memory-mapped (copy-on-write), not read: llama.cpp copies it
  straight from the page cache into the KV cache, so a restore costs about
  what reading the file would (`chatterm bench` reports both).
- `save()` writes atomically (temp + fsync + rename) into a 0700 folder with
  0600 files, then evicts least-recently-used files beyond the size budget.
  A failed write disables saving for this process and keeps the reason in
  `write_error`; chat goes on without persistence.
- One file per (model id, persona id): `<folder>/<model>/<persona>.kvstate`.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chatterm.core.atomic import atomic_write_chunks, ensure_private_dir

MAGIC = b"CHATTERM-KV\0"
FORMAT_VERSION = 1
_PREAMBLE = struct.Struct("<12sII")
DEFAULT_BUDGET_BYTES = 2 << 30
SUFFIX = ".kvstate"


@dataclass(frozen=True)
class Miss:
    reason: str


CHUNK_BYTES = 4 << 20


def chunk_crc32s(payload: memoryview, workers: int | None = None) -> list[int]:
    """CRC-32 of each CHUNK_BYTES slice, computed on all cores (zlib releases the GIL)."""
    chunks = [payload[i : i + CHUNK_BYTES] for i in range(0, payload.nbytes, CHUNK_BYTES)]
    workers = workers or max(os.cpu_count() or 1, 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(zlib.crc32, chunks))


@dataclass
class LoadedState:
    header: dict[str, Any]
    payload: memoryview
    """The payload, mapped from the file (writable copy-on-write pages, as ctypes needs)."""
    _mapping: mmap.mmap

    def verify(self) -> bool:
        """Every chunk's CRC-32 equals the header's."""
        return chunk_crc32s(self.payload) == self.header.get("chunk_crc32")

    def close(self) -> None:
        """Unmap the file; every buffer made from `payload` must be gone by now."""
        self.payload.release()
        self._mapping.close()


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    model_id: str
    persona_id: str
    tokens: int
    bytes: int
    last_used: float
    valid: bool


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def _describe_difference(key: str, found: Any, expected: Any) -> str:
    if key == "prefix_tokens":
        return "prefix tokens differ"
    if isinstance(found, str) and len(found) > 24:
        found = found[:12] + "…"
    if isinstance(expected, str) and len(expected) > 24:
        expected = expected[:12] + "…"
    return f"{key.replace('_', ' ')} differs (file {found!r}, now {expected!r})"


def read_header(fh) -> dict[str, Any]:
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
    except (UnicodeDecodeError, ValueError):
        raise ValueError("corrupt header (not JSON)") from None
    if not isinstance(header, dict) or not isinstance(header.get("compat"), dict):
        raise ValueError("corrupt header (no compat section)")
    return header


def sweep_temp_files(folder: Path, older_than_s: float = 3600.0) -> int:
    """Delete temp files left by writers that died mid-write (a live writer's
    temp file is seconds old; an hour-old one has no owner)."""
    removed = 0
    cutoff = time.time() - older_than_s
    for tmp in folder.glob("*/.*.tmp") if folder.is_dir() else []:
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def read_ms_of(path: Path) -> float:
    """Time to read a whole file into memory (what a plain load would cost)."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        buffer = bytearray(os.fstat(fh.fileno()).st_size)
        fh.readinto(buffer)
    return (time.perf_counter() - t0) * 1000.0


class KVStateCache:
    def __init__(self, folder: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.folder = folder
        self.budget_bytes = budget_bytes
        self.write_error: str | None = None

    def path_for(self, model_id: str, persona_id: str) -> Path:
        return self.folder / _safe_name(model_id) / f"{_safe_name(persona_id)}{SUFFIX}"

    def exists(self, model_id: str, persona_id: str) -> bool:
        return self.path_for(model_id, persona_id).is_file()

    # -- reading ---------------------------------------------------------
    read_header = staticmethod(read_header)  # chatterm.core.bench reads headers through the class

    def load(self, model_id: str, persona_id: str, compat: dict[str, Any]) -> LoadedState | Miss:
        path = self.path_for(model_id, persona_id)
        try:
            with open(path, "rb") as fh:
                try:
                    header = read_header(fh)
                except ValueError as exc:
                    return Miss(f"state file rejected: {exc}")
                found = header["compat"]
                for key in sorted(set(compat) | set(found)):
                    if found.get(key) != compat.get(key):
                        return Miss(
                            "state file rejected: "
                            + _describe_difference(key, found.get(key), compat.get(key))
                        )
                offset = fh.tell()
                size = header.get("payload_len")
                if not isinstance(size, int) or size <= 0 or not isinstance(header.get("chunk_crc32"), list):
                    return Miss("state file rejected: corrupt header (payload length or digests)")
                file_size = os.fstat(fh.fileno()).st_size
                if file_size < offset + size:
                    return Miss(
                        f"state file rejected: payload truncated ({file_size - offset} of {size} bytes)"
                    )
                if file_size > offset + size:
                    return Miss("state file rejected: trailing bytes after payload")
                mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except FileNotFoundError:
            return Miss("no state file yet")
        except OSError as exc:
            return Miss(f"state file unreadable: {exc.strerror or exc}")
        if hasattr(mapping, "madvise"):
            mapping.madvise(mmap.MADV_WILLNEED)
        try:
            os.utime(path)  # last used, for LRU eviction
        except OSError:
            pass
        payload = memoryview(mapping)[offset : offset + size]
        return LoadedState(header, payload, mapping)

    def read_ms(self, model_id: str, persona_id: str) -> float:
        """Time to read the whole file into memory (what a plain load would cost)."""
        path = self.path_for(model_id, persona_id)
        t0 = time.perf_counter()
        with open(path, "rb", buffering=0) as fh:
            buffer = bytearray(os.fstat(fh.fileno()).st_size)
            fh.readinto(buffer)
        return (time.perf_counter() - t0) * 1000.0

    # -- writing ---------------------------------------------------------
    def save(
        self, model_id: str, persona_id: str, compat: dict[str, Any], info: dict[str, Any], payload
    ) -> Path | None:
        """Write a state file; returns its path, or None when persistence is off."""
        if self.write_error is not None:
            return None
        view = memoryview(payload).cast("B")
        header = {
            **info,
            "model_id": model_id,
            "persona_id": persona_id,
            "compat": compat,
            "payload_len": view.nbytes,
            "payload_sha256": hashlib.sha256(view).hexdigest(),
            "chunk_bytes": CHUNK_BYTES,
            "chunk_crc32": chunk_crc32s(view),
            "created_at": time.time(),
        }
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        path = self.path_for(model_id, persona_id)
        try:
            ensure_private_dir(self.folder)
            ensure_private_dir(path.parent)
            atomic_write_chunks(path, [_PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(blob)), blob, view])
        except OSError as exc:
            self.write_error = f"cannot write {path}: {exc.strerror or exc}"
            return None
        self.evict(keep=path)
        return path

    # -- listing and eviction --------------------------------------------
    def entries(self) -> list[CacheEntry]:
        found: list[CacheEntry] = []
        if not self.folder.is_dir():
            return found
        for path in sorted(self.folder.glob(f"*/*{SUFFIX}")):
            try:
                st = path.stat()
                with open(path, "rb") as fh:
                    header = read_header(fh)
                found.append(
                    CacheEntry(
                        path,
                        str(header.get("model_id", path.parent.name)),
                        str(header.get("persona_id", path.stem)),
                        int(header.get("n_prefix_tokens", 0)),
                        st.st_size,
                        st.st_mtime,
                        True,
                    )
                )
            except (OSError, ValueError):
                try:
                    st = path.stat()
                except OSError:
                    continue
                found.append(CacheEntry(path, path.parent.name, path.stem, 0, st.st_size, st.st_mtime, False))
        return found

    def sweep_temp_files(self, older_than_s: float = 3600.0) -> int:
        return sweep_temp_files(self.folder, older_than_s)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove least-recently-used files until the total fits the budget."""
        self.sweep_temp_files()
        entries = sorted(self.entries(), key=lambda e: e.last_used)
        total = sum(e.bytes for e in entries)
        removed: list[Path] = []
        for entry in entries:
            if total <= self.budget_bytes:
                break
            if entry.path == keep:
                continue
            try:
                entry.path.unlink()
            except OSError:
                continue
            total -= entry.bytes
            removed.append(entry.path)
        return removed

    def clear(self, persona_id: str | None = None) -> int:
        if persona_id is None:
            self.sweep_temp_files(older_than_s=60.0)
        count = 0
        for entry in self.entries():
            if persona_id is None or entry.persona_id == persona_id:
                try:
                    entry.path.unlink()
                    count += 1
                except OSError:
                    pass
        return count
