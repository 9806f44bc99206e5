"""Route llama.cpp's log into Python logging with the right levels.

llama-cpp-python's stock callback maps ggml's levels from an old enum, so with
verbose=False errors are hidden (docs/engine.md). ggml's current enum is
NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continue the previous line).
Records go to the "llama.cpp" logger; lines are joined until a newline.

An early model load (`early_load`) on the CPU whose lines nobody would read
(`unread`) runs `muted`: llama.cpp then calls a C function instead of Python for each
of the load's ~1,200 lines, each of which would wait for the GIL that the
importing main thread holds.

A decode stopped by chatterm's own abort flag (a cancel, or a type-ahead
prefill making way for the send: `model.AbortFlag`) is expected, so the lines
llama.cpp writes for it (ERROR: the graph's status 1, GGML_STATUS_ABORTED;
llama_decode's ret = 2, "aborted"; and the WARN between them about the
rolled-back KV cells) are logged at DEBUG. Any other decode failure keeps its level.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import re
import threading
from typing import Any, Iterator

import llama_cpp

logger = logging.getLogger("llama.cpp")

_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_state = threading.local()
_installed = False

_ABORTED = re.compile(r"failed with error 1$|compute status: 1$|failed to decode, ret = 2$")
_ABORT_END = "ret = 2"
"""llama_decode's own line, the last of an abort's."""
_ROLLED_BACK = "removing memory module entries"


def _level(line: str, level: int) -> int:
    """`level`, or DEBUG for the lines of an abort that chatterm asked for."""
    if _ABORTED.search(line):
        _state.aborting = not line.endswith(_ABORT_END)
        return logging.DEBUG
    if getattr(_state, "aborting", False) and _ROLLED_BACK in line:
        return logging.DEBUG
    return level


def _emit(level: int, text: str) -> None:
    pending = getattr(_state, "pending", "")
    pending_level = getattr(_state, "level", logging.DEBUG)
    if level != 5:
        pending_level = _LEVELS.get(level, logging.DEBUG)
    pending += text
    *lines, pending = pending.split("\n")
    for line in lines:
        if line.strip():
            logger.log(_level(line.rstrip(), pending_level), "%s", line)
    _state.pending = pending
    _state.level = pending_level


@llama_cpp.llama_log_callback
def _callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    try:
        held = getattr(_state, "held", None)
        if held is not None:
            held.append((level, text))
            return
        _handle(level, text)
    except Exception:  # noqa: BLE001 - never raise into C
        pass


def _handle(level: int, text: bytes) -> None:
    # A model load writes ~2,000 whole DEBUG lines (the tensors, the
    # vocabulary); dropping them before any work saves 5-8 ms of a load.
    if level == 1 and text.endswith(b"\n") and not getattr(_state, "pending", ""):
        if not logger.isEnabledFor(logging.DEBUG):
            _state.level = logging.DEBUG
            return
    _emit(level, text.decode("utf-8", "replace"))


class _Collector(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.ERROR)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(record.getMessage())


@contextlib.contextmanager
def capture_errors() -> Iterator[list[str]]:
    """Collect llama.cpp's ERROR lines while the block runs.

    llama-cpp-python points stderr at /dev/null while it loads a model, so the
    reason a load failed ("tensor ... data is not within the file bounds") would
    otherwise never reach the user."""
    errors: list[str] = []
    handler = _Collector(errors)
    logger.addHandler(handler)
    try:
        yield errors
    finally:
        logger.removeHandler(handler)


@contextlib.contextmanager
def held() -> Iterator[list[tuple[int, bytes]]]:
    """Keep llama.cpp's log lines from this thread, unlogged, while the block
    runs: an early model load's (`early_load`), which the thread that takes
    the model `replay`s where a regular load would have logged them."""
    lines: list[tuple[int, bytes]] = []
    _state.held = lines
    try:
        yield lines
    finally:
        _state.held = None


def unread() -> bool:
    """Whether llama.cpp's lines, logged now, would reach nobody: every
    handler the "llama.cpp" logger passes them to (or logging's last resort,
    when none) is a NullHandler or a plain StreamHandler on a plain file
    object on fd 2. llama-cpp-python points fd 2 at /dev/null around a load,
    so a load's lines, logged there (a held load's are replayed there), are
    lost anyway; a log file, a collector (`capture_errors`) or any handler or
    stream of another kind (which might also send them elsewhere) reads them."""
    handlers: list[logging.Handler] = []
    node: logging.Logger | None = logger
    while node is not None:
        handlers += node.handlers
        node = node.parent if node.propagate else None
    for handler in handlers or [logging.lastResort]:
        if handler is None or type(handler) is logging.NullHandler:
            continue
        if type(handler) not in (logging.StreamHandler, type(logging.lastResort)):
            return False
        stream = handler.stream
        if type(stream) is not io.TextIOWrapper or stream.closed or stream.fileno() != 2:
            return False
    return True


@contextlib.contextmanager
def muted(bindings: Any) -> Iterator[bool]:
    """llama.cpp logs nothing, in every thread, while the block runs; then
    chatterm's callback is back (`install`ed before). Yields whether it is
    muted: not where `llama_max_devices`, the callback, is not a C function
    pointer (another llama-cpp-python). That is a C function that takes no
    arguments and returns a constant: called as the three-argument callback,
    it ignores them, as every caller-cleans-up calling convention llama.cpp
    is built for (x86-64 System V and Windows, AArch64) allows."""
    quiet = bindings.llama_max_devices
    if not isinstance(quiet, ctypes._CFuncPtr):
        yield False
        return
    bindings.llama_log_set(ctypes.cast(quiet, bindings.llama_log_callback), ctypes.c_void_p(0))
    try:
        yield True
    finally:
        bindings.llama_log_set(_callback, ctypes.c_void_p(0))


def replay(lines: list[tuple[int, bytes]]) -> None:
    """Log lines kept by `held`, in this thread, as if llama.cpp wrote them now."""
    for level, text in lines:
        _handle(level, text)


def install() -> None:
    """Install the callback (idempotent). llama-cpp-python installs its own at import."""
    global _installed
    if not _installed:
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
        _installed = True
