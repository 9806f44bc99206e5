"""Who may use the engine, and when it is closed.

The app's worker threads (model load, persona prepare, turns) share one engine.
Closing a llama.cpp context while another thread decodes with it crashes the
process, and app exit must not wait for a turn nobody will see. So the engine is
closed exactly once, by whoever is last: the app when it quits while no worker
holds the engine, or the last worker to let go of it after the app has quit.
An engine `replace`d by another (a model switch) is closed by the same rule:
at once when no worker holds an engine, else by the last one to let go.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

from chatterm.core.engine.interface import Engine

log = logging.getLogger(__name__)


class EngineClosing(Exception):
    """The app is quitting: the engine must not be used any more."""


class EngineLease:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._engine: Engine | None = None
        self._retired: list[Engine] = []
        """Replaced engines a worker may still be using: closed when the last one lets go."""

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def closing(self) -> bool:
        """The app is quitting (a model load in progress should give up)."""
        return self._closing

    def adopt(self, engine: Engine) -> bool:
        """Take a freshly loaded engine; False (and it is closed) when the app is quitting."""
        with self._lock:
            if not self._closing:
                self._engine = engine
                return True
        _close(engine)
        return False

    @contextlib.contextmanager
    def use(self) -> Iterator[Engine]:
        with self._lock:
            if self._closing or self._engine is None:
                raise EngineClosing()
            self._users += 1
            engine = self._engine
        try:
            yield engine
        finally:
            with self._lock:
                self._users -= 1
                last = self._closing and self._users == 0
                retired, self._retired = (self._retired, []) if self._users == 0 else ([], self._retired)
            for old in retired:
                _close(old)
            if last:
                self._close_now()

    def replace(self, engine: Engine) -> None:
        """Hand out `engine` from now on (a model switch); the engine it replaces is
        closed once no worker uses it. When the app is quitting, `engine` is closed."""
        with self._lock:
            if self._closing:
                old = engine
            else:
                old, self._engine = self._engine, engine
                if old is not None and self._users:
                    self._retired.append(old)
                    old.interrupt()  # a prefill on the old model stops instead of holding it
                    old = None
        if old is not None:
            _close(old)

    def close_when_idle(self) -> None:
        """Mark the app as quitting; close now if no worker uses the engine."""
        with self._lock:
            self._closing = True
            idle = self._users == 0
            engine = self._engine
        if idle:
            self._close_now()
        elif engine is not None:
            engine.interrupt()  # a long prefill stops now instead of holding the exit

    def _close_now(self) -> None:
        with self._lock:
            engine, self._engine = self._engine, None
            retired, self._retired = self._retired, []
        for old in retired:
            _close(old)
        if engine is not None:
            _close(engine)


def _close(engine: Engine) -> None:
    try:
        engine.close()
    except Exception:  # noqa: BLE001 - quitting must not fail on a close error
        log.exception("closing the engine failed")
