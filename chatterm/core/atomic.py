"""Atomic file writes: temp file in the same folder, fsync, rename, fsync folder.

Readers see the old file or the new one, never a torn one, even when two
processes write the same path at once (each renames its own temp file).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterable


def ensure_private_dir(folder: Path) -> None:
    """Create `folder` (and parents) and make it 0700."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)


def atomic_write_chunks(path: Path, chunks: Iterable[bytes | memoryview], mode: int = 0o600) -> None:
    """Write `path` atomically with `mode`; its folder must exist (a missing one
    is the caller's error to report, not to paper over)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
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
