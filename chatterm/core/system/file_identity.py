"""sha256 of large files (models, llama.cpp's library), cached by path + size + mtime.

A 100 MB model hashes in ~0.1 s, a 5 GB one in seconds: the digest is computed
once and kept in a small JSON file in the cache folder, keyed by the resolved
path, size and mtime_ns, so later launches only stat the file.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from chatterm.core.config import paths
from chatterm.core.system.atomic import TEMP_SUFFIX, atomic_write_bytes, sweep_temp_files

_lock = threading.Lock()


def _key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def sha256_of_file(path: Path, cache_file: Path | None = None) -> str:
    cache_file = cache_file or paths.model_hash_cache_file()
    key = _key(path)
    with _lock:
        try:
            known = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            known = {}
        if isinstance(known, dict) and isinstance(known.get(key), str):
            return known[key]
        # file_digest reads into one small reused buffer: a loop of 8 MiB
        # read()s left 16 MB in the heap of `chatterm ask`'s first run (its peak RSS).
        with open(path, "rb") as fh:
            value = hashlib.file_digest(fh, "sha256").hexdigest()
        if not isinstance(known, dict):
            known = {}
        # Drop stale entries for the same path (the file changed).
        prefix = key.rsplit("|", 2)[0] + "|"
        known = {k: v for k, v in known.items() if not k.startswith(prefix)}
        known[key] = value
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            # A launch quit during its model load ends the process at once, maybe mid-write.
            sweep_temp_files(cache_file.parent, f".{cache_file.name}.*{TEMP_SUFFIX}")
            atomic_write_bytes(cache_file, json.dumps(known, indent=0).encode())
        except OSError:
            pass  # an unwritable cache only costs a rehash next time
        return value
