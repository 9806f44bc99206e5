"""Telling a failed write to standard output from any other OSError.

Contract: inside `guarded_stdout()`, `sys.stdout` (and its `buffer`) is the
real stream, except that an OSError its writes or flushes raise becomes a
`StdoutError` (BrokenPipeError stays itself: a closed pipe is `| head`, not a
failure). `main` reports a StdoutError in one line ("cannot write to standard
output: No space left on device" under `> FILE` on a full disk) and lets
every other OSError through as it is: which file failed is not guessed from
an errno. `silence()` points fd 1 at /dev/null, as Python's docs advise for a
closed pipe, so the flush at exit does not fail a second time.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class StdoutError(OSError):
    """A write to standard output failed."""


def _guard(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutError(exc.errno, exc.strerror or str(exc)) from exc


class _Guarded:
    """A stream whose write, writelines and flush raise StdoutError; the rest is the stream's."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, data: Any) -> Any:
        return _guard(self._stream.write, data)

    def writelines(self, lines: Any) -> None:
        _guard(self._stream.writelines, lines)

    def flush(self) -> None:
        _guard(self._stream.flush)

    @property
    def buffer(self) -> "_Guarded":
        return _Guarded(self._stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def guarded_stdout() -> Iterator[None]:
    real = sys.stdout
    sys.stdout = _Guarded(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = real


def silence() -> None:
    """Point fd 1 at /dev/null (the flush at exit writes there)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # a stand-in stream (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
