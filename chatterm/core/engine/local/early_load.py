"""A local model's file load, started while llama-cpp-python is still importing.

`import llama_cpp` is about 95 ms of a 0.3 s `chatterm ask` on the 2-core
reference machine: its ctypes bindings first (~20 ms), then `llama_cpp.llama`
with numpy and jinja2, all of it holding the GIL. llama.cpp's model load
(87-96 ms for the default model) needs only the bindings, and it runs in C
without the GIL. Started on a thread as soon as the bindings are there, it
runs beside the rest of that import on a second core; the `llama_cpp.Llama`
that `open_model` makes afterwards takes the loaded model instead of loading
the file again (docs/engine.md, "Loading the model file early").

Contract:
- `begin(spec)` starts the load for a local model's `spec` and returns its
  `EarlyLoad`; the caller imports llama_cpp next (`Workspace.make_engine`
  imports the engine) and then calls `unhook()`. When llama_cpp is not
  imported yet, a `sys.meta_path` finder that finds nothing starts the load
  the first time `llama_cpp.llama` is looked for: `llama_cpp/__init__.py`
  imports the bindings before it. When it is imported already (a second
  engine in one process), the load starts at once. One early load is pending
  at a time; a `begin` while another is pending starts nothing.
- The load passes what `open_model`'s first try passes: the offload plan's
  GPU layers (`offload.plan_offload`) and `llama_cpp.Llama`'s other model
  parameters. `llama_model_load_from_file` is wrapped once. A load of the
  pending early load's file with parameters equal to its own (the progress
  callback aside) takes its result, waiting while it still loads: the model,
  or, when the early load failed, NULL, as the load itself would have
  returned (`open_model` then falls back to fewer GPU layers or reports).
  With other parameters the early model is freed first, so two copies never
  compete for memory. Every other load goes through unchanged.
- llama.cpp's log lines from the early load are kept (`llama_log.held`) and
  logged by the thread that takes its result, inside that load: where a
  regular load logs them, so `open_model` still reads llama.cpp's own error
  line, and a log file still gets the load's lines while the terminal, as
  for a regular load (llama-cpp-python points fd 2 at /dev/null there), does
  not. When nobody would read them (`llama_log.unread`: `chatterm ask`
  without a log file) and no layer goes to a GPU, the load runs
  `llama_log.muted` instead, about 25 ms sooner on the reference machine; a
  muted load that failed has logged no error line, so the load that wanted
  it runs again, logged, and names it. The mute is process-wide, so a load
  of another file waits for it to end.
- `progress` (set by `LocalEngine.load`) gets 0..0.9 from the early load, as
  from a regular one; what the load reports before it is set is not shown.
- Every other load of a model file that a thread makes inside
  `reporting(progress)` (`open_model` wraps its `Llama()` in it) reports to
  that `progress` the same way, through the same wrapper, which sets the
  parameters' progress callback: llama-cpp-python's `Llama` takes none.
- `close()` stops a load still running (its progress callback answers
  False) and frees a model nobody took; the engine calls it when its load
  returns and when it closes, `make_engine` when making the engine failed.
  Until then the load's thread keeps the interpreter from shutting down: one
  that ended with the load still in llama.cpp could crash. `outcome` says
  what became of the load: "taken", "unused", "failed" or "none" (never
  started).
- The GIL switch interval is 0.5 ms while any early load runs, and back to
  what it was when the last one ends (unless someone else changed it
  meanwhile). llama.cpp calls into Python throughout a load (each log line,
  the progress), and every call waits for the GIL: at the default 5 ms the
  importing main thread held the load back for as long as it ran, and the
  overlap saved next to nothing.
- Best effort: anything unexpected (a llama-cpp-python that imports in
  another order, a model kind with no file) means no early load, and the
  regular one runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import logging
import sys
import threading
from typing import Any, Callable, Iterator

from chatterm.core.config.catalog import ModelSpec
from chatterm.core.engine.interface import Progress

log = logging.getLogger(__name__)

SWITCH_INTERVAL_S = 0.0005
_NOT_COMPARED = ("progress_callback", "progress_callback_user_data")
_lock = threading.Lock()
_pending: "EarlyLoad | None" = None
"""The early load a `llama_model_load_from_file` may take (one at a time)."""
_running = 0
"""Early loads whose thread runs, under `_lock`: the switch interval is short while any does."""
_saved_interval = 0.0
_reporting = threading.local()
"""`callback`: the progress callback of this thread's loads (`reporting`)."""


def _fast_switching(on: bool) -> None:
    global _running, _saved_interval
    with _lock:
        _running += 1 if on else -1
        if on and _running == 1:
            _saved_interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_saved_interval, SWITCH_INTERVAL_S))
        elif not on and _running == 0 and sys.getswitchinterval() == min(_saved_interval, SWITCH_INTERVAL_S):
            sys.setswitchinterval(_saved_interval)


class EarlyLoad:
    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.outcome = "none"
        self.progress: Progress | None = None
        self.path = b""
        self._hook: _WhenBindingsImported | None = None
        self._params: Any = None
        self._model: Any = None
        self._lines: list[tuple[int, bytes]] = []
        self.muted = False
        """The load logs nothing (`llama_log.muted`): nobody would read its lines.
        Set before its thread starts; whether it was, once the thread has ended."""
        self._thread: threading.Thread | None = None
        self._done = threading.Lock()
        """Guards `_model` between `take()` and `close()`: exactly one of them gets it."""
        self._callback: Any = None  # kept referenced: llama.cpp holds the pointer
        self._llama_log: Any = None
        self._abandoned = False
        """Set by `close()`: the progress callback then stops a load still running."""

    # -- starting --------------------------------------------------------
    def start(self, bindings: Any, how: str) -> None:
        """Start the load with llama-cpp-python's bindings module (never raises
        but for an interrupt)."""
        global _pending
        try:
            self._prepare(bindings)
            with _lock:
                if _pending is not None:
                    return
            load = _wrap_loader(bindings)
            # Not a daemon: a process that ended with the load still in
            # llama.cpp crashed in the interpreter's shutdown (SIGSEGV, 1 run
            # in 5), so shutdown waits for it; `close()` makes it stop.
            thread = threading.Thread(target=self._load, args=(bindings, load), name="early-load")
        except Exception as exc:  # noqa: BLE001 - an early load is an optimisation only
            log.debug("no early model load: %s", exc)
            return
        _fast_switching(True)
        try:
            thread.start()
        except BaseException as exc:
            _fast_switching(False)
            if not isinstance(exc, Exception):
                raise
            log.debug("no early model load: %s", exc)
            return
        self._thread = thread  # started before it is published: take() joins it
        with _lock:
            if _pending is None:
                _pending = self
        log.debug("early model load started (%s%s)", how, ", muted" if self.muted else "")

    def _prepare(self, bindings: Any) -> None:
        # Imported here: these import llama_cpp, which by now is either
        # imported or (from the hook) the package this thread is importing.
        # llama-cpp-python installs its log callback when `llama_cpp._logger`
        # is imported, so that comes first: it would otherwise replace
        # chatterm's callback halfway through the load.
        import llama_cpp._logger  # noqa: F401

        from chatterm.core.engine.local import llama_log, offload

        # Checked (a GGUF's magic), not only resolved: a FIFO or a device
        # named as the model would block the load's thread, and with it the
        # interpreter's shutdown, before open_model's own check could refuse it.
        self.path = str(self.spec.gguf_file()).encode("utf-8")
        plan = offload.plan_offload(self.spec, bool(bindings.llama_supports_gpu_offload()))
        llama_log.install()
        self._llama_log = llama_log
        # Only on the CPU: a load that fails muted is loaded again to be named,
        # and a GPU load's usual failure (out of memory) is slow to reach;
        # a CPU load fails fast (a damaged file).
        self.muted = plan.n_gpu_layers == 0 and llama_log.unread()
        self._params = llama_model_params(bindings, plan.n_gpu_layers)

        def on_progress(value: float, _user_data: Any) -> bool:
            return not self._abandoned and forward_progress(self.progress, value)

        self._callback = bindings.llama_progress_callback(on_progress)
        self._params.progress_callback = self._callback

    def _load(self, bindings: Any, load: Callable[[bytes, Any], Any]) -> None:
        try:
            quiet = self._llama_log.muted(bindings) if self.muted else contextlib.nullcontext(False)
            with quiet as self.muted, self._llama_log.held() as self._lines:  # muted: none are held
                bindings.llama_backend_init()
                self._model = load(self.path, self._params)
        except Exception as exc:  # noqa: BLE001 - the model stays None: a failed load
            log.debug("early model load failed: %s", exc)
        finally:
            _fast_switching(False)

    # -- taking ----------------------------------------------------------
    def matches(self, params: Any) -> bool:
        return same_params(params, self._params)

    def take(self) -> Any:
        """The load's result once it is done: the model, or None when it failed.
        Its log lines are logged here, by the thread that loads."""
        assert self._thread is not None
        self._thread.join()
        with self._done:
            model, self._model = self._model, None
            lines, self._lines = self._lines, []
        self._llama_log.replay(lines)
        self.outcome = "taken" if model is not None else "failed"
        return model

    def wait(self) -> None:
        """Until the load's thread has ended (at once when it never ran)."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def unhook(self) -> None:
        """Remove the import hook: llama_cpp is imported, so it fired or never will."""
        if self._hook is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self._hook)
            self._hook = None

    def close(self) -> None:
        """Forget this load: stop it if it still runs, free its model if nobody
        took it (idempotent)."""
        global _pending
        self.unhook()
        self._abandoned = True
        with _lock:
            if _pending is self:
                _pending = None
        thread, self._thread = self._thread, None
        if thread is None:
            return
        thread.join()
        with self._done:
            model, self._model = self._model, None
            self._lines = []
        if model is not None:
            sys.modules["llama_cpp.llama_cpp"].llama_model_free(model)
            self.outcome = "unused"
        elif self.outcome == "none":
            self.outcome = "failed"
        log.debug("early model load: %s", self.outcome)


def forward_progress(progress: Progress | None, value: float) -> bool:
    """llama.cpp's load progress `value` (0..1) to `progress` as 0..0.9 (the
    rest is the engine's own work after the load); False stops the load."""
    if progress is None:
        return True
    try:
        return progress(min(max(float(value), 0.0), 1.0) * 0.9) is not False
    except Exception:  # noqa: BLE001 - never raise into C
        return True


@contextlib.contextmanager
def reporting(progress: Progress | None) -> Iterator[None]:
    """Loads of a model file this thread makes while the block runs report
    to `progress` (`forward_progress`; a False from it stops the load)."""
    if progress is None:
        yield
        return
    bindings = sys.modules["llama_cpp.llama_cpp"]
    _wrap_loader(bindings)
    previous = getattr(_reporting, "callback", None)
    # Referenced here for the block: llama.cpp holds only the pointer.
    _reporting.callback = bindings.llama_progress_callback(lambda value, _data: forward_progress(progress, value))
    try:
        yield
    finally:
        _reporting.callback = previous


def llama_model_params(bindings: Any, n_gpu_layers: int) -> Any:
    """The model parameters `llama_cpp.Llama(path, n_gpu_layers=...)` passes
    with its other arguments at their defaults (open_model passes no others)."""
    params = bindings.llama_model_default_params()
    params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers  # Llama's "every layer"
    params.split_mode = bindings.LLAMA_SPLIT_MODE_LAYER
    params.main_gpu = 0
    params.vocab_only = False
    params.load_mode = bindings.LLAMA_LOAD_MODE_MMAP
    return params


def same_params(a: Any, b: Any) -> bool:
    """Whether two llama_model_params load the same model: every field equal
    but the progress callback; a pointer field only when both are NULL."""
    for name, kind in type(a)._fields_:
        if name in _NOT_COMPARED:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if kind is ctypes.c_void_p or issubclass(kind, ctypes._Pointer):
            if x or y:
                return False
        elif x != y:
            return False
    return True


def _wrap_loader(bindings: Any) -> Callable[[bytes, Any], Any]:
    """Wrap `llama_model_load_from_file` in the bindings module (once), the
    function llama-cpp-python's `Llama` calls through it: a load takes the
    pending early load of its file, or goes on with this thread's progress
    callback (`reporting`). Returns the function it wraps."""
    current = bindings.llama_model_load_from_file
    original = getattr(current, "unwrapped", None)
    if original is not None:
        return original
    original = current

    def load_from_file(path_model: bytes, params: Any) -> Any:
        global _pending
        with _lock:
            pending = _pending
            early = pending if pending is not None and pending.path == path_model else None
            if early is not None:
                _pending = None
        if early is None and pending is not None and pending.muted:
            pending.wait()  # its mute is process-wide: this load's error line must not fall in it
        if early is not None:
            if not early.matches(params):
                early.close()  # another load of its file: free the early copy first
            elif (model := early.take()) is not None or not early.muted:
                return model
            # else it failed without a word: this load tells why
        callback = getattr(_reporting, "callback", None)
        if callback is not None:
            params.progress_callback = callback
        return original(path_model, params)

    load_from_file.unwrapped = original  # type: ignore[attr-defined]
    bindings.llama_model_load_from_file = load_from_file
    return original


class _WhenBindingsImported(importlib.abc.MetaPathFinder):
    """Finds nothing; starts the early load the first time `llama_cpp.llama`
    is looked for. It leaves `sys.meta_path` alone while the import system
    walks it (a finder removed mid-walk makes it skip the next one): `unhook`
    removes it afterwards."""

    def __init__(self, early: EarlyLoad):
        self.early = early
        self.fired = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "llama_cpp.llama" and not self.fired:
            self.fired = True
            bindings = sys.modules.get("llama_cpp.llama_cpp")
            if bindings is not None:
                self.early.start(bindings, "while llama_cpp imports")
        return None


def begin(spec: ModelSpec) -> EarlyLoad:
    """Start loading `spec`'s model file (see the module contract)."""
    early = EarlyLoad(spec)
    if spec.kind == "local":
        if "llama_cpp.llama" in sys.modules:
            early.start(sys.modules["llama_cpp.llama_cpp"], "llama_cpp already imported")
        else:
            early._hook = _WhenBindingsImported(early)
            sys.meta_path.insert(0, early._hook)
    return early
