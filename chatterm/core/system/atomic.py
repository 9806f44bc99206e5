"""Atomic file writes: temp file in the same folder, fsync, rename, fsync folder.

Readers see the old file or the new one, never a torn one, even when two
processes write the same path at once (each renames its own temp file). A
writer killed mid-write leaves only its temp file, `.NAME.*.tmp` beside NAME;
`sweep_temp_files` removes those old enough that no live writer owns them.
The file gets the mode asked for (0600 unless told otherwise: state files and
caches stay private), or with `mode=None` the usual mode of a new file, 0666
less the umask (exports, which are made to be shared).
"""

from __future__ import annotations

import os
import secrets
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


def _create_temp(path: Path, perms: int) -> tuple[int, str]:
    """A new, empty temp file beside `path`, created with `perms` less the umask.
    Not mkstemp: it always creates 0600, and the umask a new file should get
    cannot be read without changing it for every thread of the process."""
    for _ in range(100):  # 32 random bits: one clash is rare, 100 in a row is no accident
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), perms), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name beside {path}")


def atomic_write_chunks(path: Path, chunks: Iterable[bytes | memoryview], mode: int | None = 0o600) -> None:
    """Write `path` atomically with `mode` (None: 0666 less the umask); its
    folder must exist (a missing one is the caller's error to report, not to
    paper over)."""
    # A given mode is set once the data is in; until then the file is 0600, as mkstemp made it.
    fd, tmp = _create_temp(path, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
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
