"""Persona KV state files: the prefilled system prompt of a persona, on disk.

File layout (little-endian):

    b"CHATTERM-KV\\0"  12-byte magic
    u32               format version (FORMAT_VERSION)
    u32               header length H
    H bytes           UTF-8 JSON header
    payload           the raw `llama_state_get_data` blob

Contract:
- No pickle anywhere: the header is JSON, the payload raw bytes handed to
  llama.cpp only after every check passed.
- `load()` returns the payload only when the header's `compat` equals the
  caller's expected `compat` key by key (model sha256, llama.cpp build, KV types,
  flash attention, rope parameters, template hash, persona hash, prefix tokens
  ...), the payload length matches and its sha256 matches. Anything else is a
  `Miss` with a one-line reason; the caller rebuilds and overwrites the file.
  The sha256 check can run on another core while llama.cpp loads the payload
  (`LoadedState.verify()`); the caller must discard the state if it fails.
- `save()` writes atomically (temp + fsync + rename) into a 0700 folder with
  0600 files, then evicts least-recently-used files beyond the size budget.
  A failed write disables saving for this process and keeps the reason in
  `write_error`; chat goes on without persistence.
- One file per (model id, persona id): `<folder>/<model>/<persona>.kvstate`.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
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


@dataclass
class LoadedState:
    header: dict[str, Any]
    payload: bytearray
    read_ms: float

    def verify(self) -> bool:
        """sha256 of the payload equals the header's (hashlib releases the GIL)."""
        return hashlib.sha256(self.payload).hexdigest() == self.header.get("payload_sha256")


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
    @staticmethod
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

    def load(self, model_id: str, persona_id: str, compat: dict[str, Any]) -> LoadedState | Miss:
        path = self.path_for(model_id, persona_id)
        t0 = time.perf_counter()
        try:
            with open(path, "rb", buffering=0) as fh:
                try:
                    header = self.read_header(fh)
                except ValueError as exc:
                    return Miss(f"state file rejected: {exc}")
                found = header["compat"]
                for key in sorted(set(compat) | set(found)):
                    if found.get(key) != compat.get(key):
                        return Miss(
                            "state file rejected: "
                            + _describe_difference(key, found.get(key), compat.get(key))
                        )
                size = header.get("payload_len")
                if not isinstance(size, int) or size <= 0:
                    return Miss("state file rejected: corrupt header (payload length)")
                payload = bytearray(size)
                got = fh.readinto(payload)
                extra = fh.read(1)
        except FileNotFoundError:
            return Miss("no state file yet")
        except OSError as exc:
            return Miss(f"state file unreadable: {exc.strerror}")
        if got != size:
            return Miss(f"state file rejected: payload truncated ({got} of {size} bytes)")
        if extra:
            return Miss("state file rejected: trailing bytes after payload")
        read_ms = (time.perf_counter() - t0) * 1000.0
        try:
            os.utime(path)  # last used, for LRU eviction
        except OSError:
            pass
        return LoadedState(header, payload, read_ms)

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
                    header = self.read_header(fh)
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

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove least-recently-used files until the total fits the budget."""
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
        count = 0
        for entry in self.entries():
            if persona_id is None or entry.persona_id == persona_id:
                try:
                    entry.path.unlink()
                    count += 1
                except OSError:
                    pass
        return count
