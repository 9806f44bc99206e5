"""Atomic file writes: temp file in the same folder, fsync, rename, fsync folder.

Readers see the old file or the new one, never a torn one, even when two
processes write the same path at once (each renames its own temp file). A
writer killed mid-write leaves only its temp file, `.NAME.*.tmp` beside NAME;
`sweep_temp_files` removes those old enough that no live writer owns them.
The file gets the mode asked for (0600 unless told otherwise: state files and
caches stay private), or with `mode=None` the usual mode of a new file, 0666
less the umask (exports, which are made to be shared).

`replace_output` writes a file the user named (an export, benchmark JSON):
atomically, but a link is followed, a FIFO or device is streamed to, and the
session database is refused; every failure is one ChattermError line.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterable

from chatterm.errors import ChattermError

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


def replace_output(path: Path, chunks: Iterable[bytes], database: Path | None = None) -> None:
    """Replace `path`, a file the user named, with `chunks` all at once, or
    raise ChattermError and leave nothing behind. A new file gets a new
    file's usual mode (0666 less the umask, as the database): an output is
    made to be shared, and a user who keeps conversations private sets a
    umask for that. An existing file keeps its mode, and a link to one is
    followed (the file it names is replaced, not the link). A path that is
    there and is not a file (a FIFO, /dev/null, a shell's /dev/fd/N) is
    written to as a stream: replacing it would put a file in its place.
    `database` (the session database, with its -wal and -shm) is refused:
    writing there would replace every session."""
    try:
        refuse_database(path, database)
        info = path.stat() if path.exists() else None
        if info is not None and stat.S_ISDIR(info.st_mode):
            # Said as such: the rename onto "." said "Device or resource busy".
            raise ChattermError(f"{path} is a folder; name a file in it")
        if info is not None and not stat.S_ISREG(info.st_mode):
            with open(path, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
            return
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        atomic_write_chunks(target, chunks, info.st_mode & 0o777 if info is not None else None)
    except OSError as exc:
        raise ChattermError(f"cannot write {path}: {exc.strerror or exc}") from None


def refuse_database(path: Path, database: Path | None) -> None:
    """A ChattermError when `path` is the session database `database` (or its
    -wal or -shm file), however it is reached."""
    if database is None:
        return
    for suffix in ("", "-wal", "-shm"):
        try:
            same = path.samefile(f"{database}{suffix}")
        except OSError:  # either is not there
            continue
        if same:
            raise ChattermError(f"{path} is the session database; write to another file")


def cannot_create_in(folder: Path) -> str | None:
    """Why no file can be created in `folder` (where atomic writes put their
    temp file, and SQLite its -wal and -shm), else None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)
