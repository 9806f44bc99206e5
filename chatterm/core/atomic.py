"""Atomic file writes: temp file in the same folder, fsync, rename, fsync folder.

Readers see the old file or the new one, never a torn one, even when two
processes write the same path at once (each renames its own temp file). A
writer killed mid-write leaves only its temp file, `.NAME.*.tmp` beside NAME;
`sweep_temp_files` removes those old enough that no live writer owns them.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Iterable


TEMP_SUFFIX = ".tmp"


def sweep_temp_files(folder: Path, pattern: str = ".*" + TEMP_SUFFIX, older_than_s: float = 3600.0) -> int:
    """Delete the temp files matching `pattern` in `folder` (a glob, so
    "*/.*.tmp" reaches one level down) older than `older_than_s`: a live
    writer's temp file is seconds old. Returns how many were removed."""
    removed = 0
    cutoff = time.time() - older_than_s
    for tmp in folder.glob(pattern) if folder.is_dir() else []:
        try:
            if tmp.stat().st_mtime < cutoff:
                tmp.unlink()
                removed += 1
        except OSError:
            pass
    return removed


def ensure_private_dir(folder: Path) -> None:
    """Create `folder` (and parents) and make it 0700."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)


def atomic_write_chunks(path: Path, chunks: Iterable[bytes | memoryview], mode: int = 0o600) -> None:
    """Write `path` atomically with `mode`; its folder must exist (a missing one
    is the caller's error to report, not to paper over)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems cannot fsync a folder; the rename is still atomic


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o600) -> None:
    atomic_write_chunks(path, [data], mode)
