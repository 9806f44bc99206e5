"""Reading a small file whole from a place chatterm does not own.

Contract: `read_small(path, limit)` returns the bytes of a regular file of at
most `limit` bytes, or raises OSError with a `strerror` a user can read:
the OS's own, "Is a directory", "not a regular file" (a FIFO, a socket, a
device) or "N bytes, more than the LIMIT MiB a FILE is". It never blocks: a FIFO
in a model store or as a persona or settings file made a plain read wait
for a writer forever (`chatterm models` hung, and the TUI could not exit while its worker
thread did); `streams=True` reads one all the same, for a file the user
named. It never reads more than `limit` bytes: a manifest truncated to
3 GB was read whole to say it is not JSON.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path


def read_small(path: Path, limit: int, what: str = "a file", *, streams: bool = False) -> bytes:
    """The whole of `path` (see the module contract); `what` names the kind of
    file in the size error ("a manifest"). `streams`: a pipe or a device is
    read too, waiting for its writer (a file the user named on the command
    line: `--models <(...)`, `--models /dev/stdin`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if streams and (stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode)):
            os.set_blocking(fd, True)
        elif not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"{info.st_size:,} bytes, more than the {limit / (1 << 20):g} MiB {what} is",
                          str(path))
        data = fh.read(limit + 1)
    if len(data) > limit:  # grew since the stat
        raise OSError(errno.EFBIG, f"more than the {limit / (1 << 20):g} MiB {what} is", str(path))
    return data
